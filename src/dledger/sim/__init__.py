"""Deterministic simulation of the Raft core."""
