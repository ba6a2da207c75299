"""The kinds of event the store holds: one list, which the store validates rows against
and `gpuguard events --kind` offers (a module of its own: the command line imports it
without sqlite3).

`repair`: a GPU reset or driver reload the kernel log showed (issue 21, item 3), its
status the kind of repair (gpu_reset, driver_reload); `qualify`: one GPU's qualify run
(issue 29), its status `pass` or the worst qualify rule's status."""

KINDS = ("rule", "xid", "supervisor", "ack", "probe", "repair", "qualify")
