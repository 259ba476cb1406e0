"""Hostile-client tests: real member processes, attacked with nothing but the wire format."""

from __future__ import annotations

from integration.conftest import make_cluster

__all__ = ["make_cluster"]
