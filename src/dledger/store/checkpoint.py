"""Small state files replaced atomically: write a temp file, fsync, rename, fsync dir.

`checkpoint` is JSON; `currterm` is written in upstream DLedger's Java Properties form
(`currTerm=`, `voteLeader=`, empty for no vote), so upstream reads dledger's term and vote
too. They are read back by store/offline.py (`read_checkpoint`, `read_currterm`, which
read both forms), one rule for every reader: missing is None, unreadable an error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dledger.fsutil import write_atomic as write_bytes_atomic
from dledger.store.properties import format_properties


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    write_bytes_atomic(path, json.dumps(data, sort_keys=True).encode())


def write_currterm(path: Path, term: int, voted_for: str | None) -> None:
    """`currterm` as upstream's MemberState writes it; raises OSError."""
    write_bytes_atomic(path, format_properties({"currTerm": str(term), "voteLeader": voted_for or ""}))
