"""`gpuguard daemon`: scheduled checks, Prometheus metrics, udev and Xid events, systemd."""
