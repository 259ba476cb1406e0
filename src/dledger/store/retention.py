"""Retention: which old data files to delete, oldest first.

Pure policy, so it is tested without filling a disk or waiting for files to age: the store
passes the files that lie wholly below the live range, oldest first, the disk usage and the
time. Two users: a group member's Raft log (upstream DLedger: expired files go only once the
disk is `check_expired_ratio` full; with `retention_hours`, as Kafka's log.retention.hours,
files older than that go whatever the usage: `aged_out`) and a broker's commit log (upstream
RocketMQ's CleanCommitLogService: expired files go whatever the usage, and above the disk
ratio the oldest go too until usage is back under it).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NamedTuple


class Candidate(NamedTuple):
    size: int
    mtime: float


EXPIRE_AT_ANY_USAGE = -1.0  # check_expired_ratio: expired files go whatever the disk usage


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
    force_until: float | None = None,
    full_ratio: float | None = None,
) -> Plan:
    """Above `check_expired_ratio` delete expired files; above `force_clean_ratio` also
    unexpired ones, oldest first, until usage is back under `force_until` (None: the check
    ratio). A negative check ratio deletes expired files at any usage.

    The disk is full when usage stays above `full_ratio` (None: the force ratio) after all that.
    """
    if usage_ratio <= check_expired_ratio:
        return Plan(0, False)  # (below both ratios: a full-ratio above them is not reached either)
    expire_before = now - reserved_hours * 3600
    ratio = usage_ratio
    n = 0
    forcing = usage_ratio > force_clean_ratio
    target = check_expired_ratio if force_until is None else force_until
    for c in candidates:
        expired = c.mtime < expire_before
        if not expired and not (forcing and ratio > target):
            break
        n += 1
        ratio -= c.size / max(total_bytes, 1)
    return Plan(n, ratio > (force_clean_ratio if full_ratio is None else full_ratio))


def aged_out(candidates: list[Candidate], now: float, hours: float) -> int:
    """How many leading candidates were last written more than `hours` ago (0 hours: off).
    Oldest first, stopping at the first younger one: the log stays one contiguous range."""
    if hours <= 0:
        return 0
    before = now - hours * 3600
    n = 0
    for c in candidates:
        if c.mtime >= before:
            break
        n += 1
    return n


def disk_usage_ratio(path: Path) -> tuple[float, int]:
    """(used / total, total bytes) of the file system holding `path`."""
    usage = shutil.disk_usage(path)
    return (usage.used / usage.total if usage.total else 0.0), usage.total
