"""Schedulers acting on gpuguard's verdict (Slurm, Kubernetes): the top layer beside the CLI."""
