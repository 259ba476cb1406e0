"""Spark connector tests (need Java and the `spark` extra)."""
