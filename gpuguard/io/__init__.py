"""Small I/O helpers every layer may use: atomic writes, bounded reads, the host's
paths, pipes, deadlines."""
