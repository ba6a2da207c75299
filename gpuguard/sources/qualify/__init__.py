"""`gpuguard qualify`'s collection (issue 29, docs/qualify.md): the kernels (kernels.py),
the CUDA worker each GPU runs them in (child.py), the NVML sampler beside them
(sampler.py) and the lines and samples turned into one `qualify` reading per GPU
(assemble.py). Standard library only at the top of each module: the worker loads libcuda
through gpuguard/sources/cuda_api.py after its fork, never the parent."""
