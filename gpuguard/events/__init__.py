"""The event store: what happened on this host, recording, escalation, the `events`
and `ack` commands."""
