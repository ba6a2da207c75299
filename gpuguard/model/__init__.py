"""What gpuguard knows: the snapshot and its readings, results, rules, the GPU identity."""
