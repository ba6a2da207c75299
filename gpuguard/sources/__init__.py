"""Sources fill a snapshot: live NVML, or a recorded file (snapshot JSON, nvidia-smi XML).

Kept free of imports: `gpuguard check` imports the NVML source before forking its
worker, and everything imported on that path delays the fork.
"""
