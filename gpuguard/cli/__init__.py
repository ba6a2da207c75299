"""The `gpuguard` command line."""
