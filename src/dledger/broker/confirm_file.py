"""A replica's confirm offset on disk (upstream keeps it in the store checkpoint): JSON
{"confirm_offset": o, "confirmed_index": i}, written temp + fsync + rename. The broker saves
it every second and at stop; `dledger audit` reads the index (what replicas must agree on).
A lost update only makes readers wait for the next one after a restart."""

from __future__ import annotations

import json
from pathlib import Path

from dledger.fsutil import write_atomic

CONFIRM_FILE = "confirmOffset"


def write_confirm(store_dir: Path, offset: int, index: int) -> None:
    write_atomic(store_dir / CONFIRM_FILE, json.dumps({"confirm_offset": offset, "confirmed_index": index}).encode())


def read_confirm(store_dir: Path) -> tuple[int, int]:
    """(confirm offset, confirmed index); (-1, -1) when missing or unreadable."""
    try:
        data = json.loads((store_dir / CONFIRM_FILE).read_text())
        return int(data["confirm_offset"]), int(data["confirmed_index"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return -1, -1
