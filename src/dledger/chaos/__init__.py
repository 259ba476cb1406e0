"""Fault injection on real member processes ("Jepsen-style"): link proxies, a seeded
nemesis, a recording workload and a checker. Run one with `python -m dledger.chaos`."""

from dledger.chaos.checker import CheckResult, FinalState, LogEntry, MemberLog, Violation, check, format_summary
from dledger.chaos.runner import RunConfig, RunError, RunReport, run

__all__ = [
    "CheckResult",
    "FinalState",
    "LogEntry",
    "MemberLog",
    "RunConfig",
    "RunError",
    "RunReport",
    "Violation",
    "check",
    "format_summary",
    "run",
]
