"""Retention as DLedger: which old data files to delete when the disk fills up.

Pure policy, so it is tested without filling a disk: the store passes the
files that lie wholly below the live range, oldest first.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NamedTuple


class Candidate(NamedTuple):
    size: int
    mtime: float


class Plan(NamedTuple):
    delete: int  # how many leading candidates to delete
    disk_full: bool


def plan_deletions(
    candidates: list[Candidate],
    usage_ratio: float,
    total_bytes: int,
    now: float,
    reserved_hours: float,
    check_expired_ratio: float,
    force_clean_ratio: float,
) -> Plan:
    """Above `check_expired_ratio` delete expired files; above `force_clean_ratio` also
    unexpired ones, oldest first, until usage is back under the check ratio.

    The disk is full when usage stays above the force ratio after all that.
    """
    if usage_ratio <= check_expired_ratio:
        return Plan(0, False)
    expire_before = now - reserved_hours * 3600
    ratio = usage_ratio
    n = 0
    forcing = usage_ratio > force_clean_ratio
    for c in candidates:
        expired = c.mtime < expire_before
        if not expired and not (forcing and ratio > check_expired_ratio):
            break
        n += 1
        ratio -= c.size / max(total_bytes, 1)
    return Plan(n, ratio > force_clean_ratio)


def disk_usage_ratio(path: Path) -> tuple[float, int]:
    """(used / total, total bytes) of the file system holding `path`."""
    usage = shutil.disk_usage(path)
    return (usage.used / usage.total if usage.total else 0.0), usage.total
