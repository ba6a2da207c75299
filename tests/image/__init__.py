"""packaging/docker/Dockerfile built and run (issue 35): on a Debian root of the tests' own
(python:3.11-slim cannot be pulled here), from wheels built on the host, with no network
during the build; `gpuguard check` in it answers as on the host, and the daemon runs as
packaging/kubernetes/daemonset.yaml runs it (conftest.py)."""
