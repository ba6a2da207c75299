"""`gpuguard qualify` above the collection (issue 29, docs/qualify.md): run.py runs it on
the host's GPUs (the workers and sampler of gpuguard/sources/qualify/), evidence.py
keeps what it found (the bundle, the event store), chart.py draws it. A layer of its
own, above outputs (it renders) and below the supervisor and the schedulers (issue 30:
they wait for a pass before a GPU returns to service)."""
