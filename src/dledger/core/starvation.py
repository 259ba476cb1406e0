"""How late this member has recently heard what should arrive every heartbeat period, so the
elector can wait longer before it gives up on a leader (or a leader on its followers) on a
starved machine.

A member judges silence by the clock, but on a machine whose CPUs are taken by other programs
neither the leader nor the follower runs for hundreds of milliseconds at a time: the leader's
heartbeats leave late, the follower reads them late, and a timeout tuned for a fast failover
(docs/configuration.md, `heart_beat_time_interval_ms`) elects a new leader while the old one
was only waiting for a CPU. An idle group beside busy neighbours then changes leader every
few seconds, and every election stalls its writers.

The idea of adaptive failure detectors (phi accrual, as Cassandra and Akka use): measure the
gaps the member actually sees and stretch the timeout to twice the longest recent gap, up to
a cap (`adaptive_timeout_max_ms`). Counted: the member's own loop stalls; its leader's
messages that came late but within the *unstretched* election timeout (a near miss; a longer
gap, survived only thanks to the stretch, would ratchet it up to the cap for a leader that
limps just in time); for a leader, its voters' answers late but within the unstretched lease
(a longer silence is an outage, and no single peer or learner may hold a cut-off leader in
place). A follower also refuses votes that much longer (`LeaderElector.leader_alive`), so a
member that restarted with its gaps forgotten does not win at the plain lease. On a quiet
machine the gaps stay near the heartbeat period and nothing changes; a dead leader is still
replaced, within the lease plus the cap. Safety does not depend on it: a longer timeout or a
longer vote refusal never shortens what lease reads rely on (core.read_index), though a
cut-off leader serves `leader`-consistency reads up to the cap longer before it steps down.
"""

from __future__ import annotations

WINDOW_MS = 300_000  # gaps are remembered for one to two windows (starved spells last minutes)


class RecentGaps:
    """The longest gap noted in the last one to two windows (two buckets: O(1) per note)."""

    def __init__(self, window_ms: int = WINDOW_MS) -> None:
        self.window_ms = window_ms
        self._bucket_start = 0
        self._current = 0  # the longest gap of the current bucket
        self._previous = 0  # ... of the one before

    def note(self, gap_ms: int, now: int) -> None:
        self._roll(now)
        if gap_ms > self._current:
            self._current = gap_ms

    def longest(self, now: int) -> int:
        self._roll(now)
        return max(self._current, self._previous)

    def _roll(self, now: int) -> None:
        if now - self._bucket_start < self.window_ms:
            return
        # one window passed: the current bucket becomes the previous; two: both are stale
        self._previous = self._current if now - self._bucket_start < 2 * self.window_ms else 0
        self._current = 0
        self._bucket_start = now


def extra_wait(longest_gap_ms: int, base_ms: int, cap_ms: int) -> int:
    """What to add to a timeout of `base_ms` so that it lasts twice the longest recent gap,
    at most `cap_ms` (0: adaptation off)."""
    return max(0, min(cap_ms, 2 * longest_gap_ms - base_ms))


__all__ = ["WINDOW_MS", "RecentGaps", "extra_wait"]
