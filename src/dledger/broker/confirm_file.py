"""A replica's confirm offset on disk (upstream keeps it in the store checkpoint): JSON
{"confirm_offset": o, "confirmed_index": i}. As upstream's CheckpointFile, a `.bak` copy is
written first, then the main file (each temp + fsync + rename), and a reader that finds the
main file missing or torn reads the `.bak`. The broker saves it every second and at stop;
`dledger audit` reads the index (what replicas must agree on). A lost update only makes
readers wait for the next one after a restart."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from dledger.fsutil import read_with_backup, write_with_backup

log = logging.getLogger(__name__)

CONFIRM_FILE = "confirmOffset"


def write_confirm(store_dir: Path, offset: int, index: int) -> None:
    data = json.dumps({"confirm_offset": offset, "confirmed_index": index}).encode()
    write_with_backup(store_dir / CONFIRM_FILE, data)


def _parse(data: bytes) -> tuple[int, int]:
    doc = json.loads(data)
    return int(doc["confirm_offset"]), int(doc["confirmed_index"])


def read_confirm(store_dir: Path) -> tuple[int, int]:
    """(confirm offset, confirmed index), from the `.bak` when the main file is missing or
    unreadable; (-1, -1) when neither can be read."""
    value, problems = read_with_backup(store_dir / CONFIRM_FILE, _parse,
                                       (ValueError, KeyError, TypeError, UnicodeDecodeError))
    for p in problems:
        log.warning("confirm offset file %s", p)
    return value if value is not None else (-1, -1)
