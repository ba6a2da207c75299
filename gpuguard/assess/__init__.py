"""Judge this host once (issue 27): one owner of collecting a host, evaluating the rules
and applying its history (acks, escalation, the GPUs seen), for every consumer: `check`,
`status --cold`, `slurm health|prolog|epilog` and the daemon's cycle all go through
gpuguard/assess/once.py, and nothing else calls the rule engine or the history step
(tests/test_layers.py)."""
