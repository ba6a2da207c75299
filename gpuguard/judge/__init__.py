"""The machinery rules run on: the check registry, the engine, suggested actions, Xid
grading, trends."""
