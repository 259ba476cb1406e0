"""Small JSON state files replaced atomically: write a temp file, fsync, rename, fsync dir.

They are read back by store/offline.py (`read_checkpoint`, `read_currterm`), one rule for
every reader: missing is None, unreadable an error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dledger.fsutil import write_atomic as write_bytes_atomic


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    write_bytes_atomic(path, json.dumps(data, sort_keys=True).encode())
