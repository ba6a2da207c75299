"""Slurm acting on gpuguard's verdict (docs/slurm.md): the decisions, the brake, the node
as Slurm reports it, the scripts' runs; the click layer is gpuguard/cli/slurm.py."""
