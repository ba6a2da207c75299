"""No failback to a GPU variant that cannot run (issue 24): the last image.cuda result
(the daemon judges each service's GPU variant image or Python environment every slow
cycle, gpuguard/checks/image.py) critical for this service keeps it on its CPU variant.
Only critical blocks: unknown (an image that declares no CUDA version, Docker not
answering) does not, since the failback's own start and readiness probe then decide."""

from __future__ import annotations

from gpuguard.model.results import Result, Status

RULE = "image.cuda"


def blocks_failback(results: list[Result], service: str) -> str | None:
    """Why the service's GPU variant cannot run here, or None."""
    for result in results:
        if result.rule != RULE:
            continue
        if (result.observed.get("service_status") or {}).get(service) != Status.CRITICAL.value:
            continue
        detail = (result.observed.get("services") or {}).get(service) or {}
        return f"{RULE}: {detail.get('message') or result.message}"
    return None
