"""Replicated state machines on the log: the API, the applier, snapshots."""
