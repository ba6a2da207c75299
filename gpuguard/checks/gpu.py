"""gpu.count: the GPUs the driver sees are the GPUs this host should have."""

from __future__ import annotations

from gpuguard.checks import CheckContext, Finding, host_check, ok


@host_check("gpu.count")
def count(ctx: CheckContext) -> Finding:
    seen = ctx.snapshot.host.gpu_count.get()
    expected = ctx.profile.gpu_count
    if expected is None:
        if seen == 0:
            return ctx.fail("the driver sees no GPU", gpu_count=seen)
        return ok(f"{seen} GPU(s) (no gpu_count in the profile to compare with)", gpu_count=seen)
    if seen != expected:
        return ctx.fail(f"{seen} GPU(s) visible, the profile expects {expected}",
                        gpu_count=seen, expected=expected)
    return ok(f"{seen} GPU(s), as the profile expects", gpu_count=seen, expected=expected)
