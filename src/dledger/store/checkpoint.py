"""Small JSON state files replaced atomically: write a temp file, fsync, rename, fsync dir."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from dledger.fsutil import write_atomic as write_bytes_atomic

log = logging.getLogger(__name__)


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    write_bytes_atomic(path, json.dumps(data, sort_keys=True).encode())


def read_json(path: Path) -> dict[str, Any] | None:
    """The file's object, or None when missing or unreadable (the caller falls back)."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("ignoring unreadable %s: %s", path, e)
        return None
    return data if isinstance(data, dict) else None
