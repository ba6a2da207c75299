"""gpuguard: hardware preflight and health checks for NVIDIA GPU inference hosts."""

__version__ = "0.1.0"
