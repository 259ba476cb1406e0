"""Is a group healthy? One verdict from every member's own view (`dledger health`, `status --check`).

Healthy means: one member says it leads in the highest term, every member of the group
(as the members list it, not only those asked) answers and follows that leader in that term
(a member down or astray: the group works, but has lost a copy), and every member's ledger
end is within `max_lag` entries of the leader's commit index; no store or state machine is
failed. A member that answers with an error other than a transport failure (UNKNOWN_GROUP:
the wrong group name) reports that error, not "down".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from dledger.codes import DLedgerError, ResponseCode
from dledger.runtime.client import Metadata

DEFAULT_MAX_LAG = 1000
_FOLLOWING = ("follower", "learner")  # the roles of a member that follows the leader


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    summary: str  # one line: "leader n1, term 7, 3/3 up, max lag 12 entries"
    leader: str | None
    term: int
    up: int
    members: int
    max_lag: int | None  # entries behind the leader's commit index, worst member (None: no leader)
    problems: list[str] = field(default_factory=list)
    insecure: list[str] = field(default_factory=list)  # members run --insecure: healthy, but anyone may steer them
    learners: list[str] = field(default_factory=list)  # members that neither vote nor count for commit

    @property
    def line(self) -> str:
        """The verdict as people read it: "healthy: leader n1, …" or "NOT healthy: …"."""
        return ("healthy: " if self.ok else "NOT healthy: ") + self.summary

    def as_json(self) -> dict[str, object]:
        return {"ok": self.ok, "summary": self.summary, "leader": self.leader, "term": self.term, "up": self.up,
                "members": self.members, "max_lag": self.max_lag, "problems": self.problems,
                "insecure": self.insecure, "learners": self.learners}


def assess(views: Mapping[str, Metadata | DLedgerError], max_lag: int = DEFAULT_MAX_LAG,
           learners: Collection[str] = ()) -> Health:
    """The verdict on a group from each member's answer (its Metadata, or the error asking it).
    `learners`: the members of `views` that are learners (docs/operations.md): they must answer
    and keep up like the others, but the quorum is the voters'."""
    up = {m: v for m, v in views.items() if isinstance(v, Metadata)}
    problems = [f"{m}: {_error(v)}" for m, v in views.items() if isinstance(v, DLedgerError)]
    # the group is what its members say it is, not the addresses a caller happened to give
    unasked = sorted({m for v in up.values() for m in v.members} - set(views))
    problems += [f"{m}: not asked (not in --peers; the members name it)" for m in unasked]
    voters = [m for m in views if m not in learners]
    quorum = len(voters) // 2 + 1
    term = max((v.term for v in up.values()), default=-1)
    leader = _leader(up, term)
    lag = None
    astray = []
    if leader is None:
        problems.append("no leader" + (f" in term {term}" if term >= 0 else ""))
    else:
        # every other member must follow that leader in its term (a cut-off candidate, a deposed
        # leader still claiming, a follower of a stale term: the group has lost a copy)
        astray = [m for m, v in up.items() if m != leader and (v.term != term or v.role not in _FOLLOWING
                                                                or v.leader_id != leader)]
        problems += [f"{m}: {up[m].role} in term {up[m].term}, following {up[m].leader_id or 'nobody'}"
                     for m in astray]
        commit = up[leader].committed_index
        lags = {m: max(0, commit - v.ledger_end_index) for m, v in up.items()}
        lag = max(lags.values())
        problems += [f"{m}: {n} entries behind the leader's commit index {commit}" for m, n in lags.items()
                     if n > max_lag]
    problems += [f"{m}: {v.store_error}" for m, v in up.items() if v.store_error]
    problems += [f"{m}: state machine stopped: {v.state_machine_error}" for m, v in up.items() if v.state_machine_error]
    problems += [f"{m}: installing snapshot {v.install_index} from the leader" for m, v in up.items()
                 if v.install_index >= 0]
    voters_up = sum(1 for m in voters if m in up)
    if voters_up < quorum:
        problems.append(f"only {voters_up} of {len(voters)} voters answer: no quorum ({quorum} needed)")
    head = f"leader {leader}, term {term}" if leader is not None else "no leader"
    lag_text = f", max lag {lag} entries" if lag is not None else ""
    insecure = sorted(m for m, v in up.items() if v.security == "insecure")
    warn = f", INSECURE ({', '.join(insecure)} run --insecure: no authentication)" if insecure else ""
    learning = sorted(m for m in views if m in learners)
    learner_text = f" (learners: {', '.join(learning)})" if learning else ""
    summary = f"{head}, {len(up)}/{len(views)} up{learner_text}{lag_text}{warn}"
    ok = leader is not None and len(up) == len(views) and not unasked and not astray and (
        lag is None or lag <= max_lag) and not any(v.store_error or v.state_machine_error for v in up.values())
    return Health(ok, summary if ok else f"{summary}: {problems[0]}" if problems else summary, leader, term,
                  len(up), len(views), lag, problems, insecure, learning)


def _leader(up: Mapping[str, Metadata], term: int) -> str | None:
    """The member that says it leads in the highest term, if it answered."""
    claims = [m for m, v in up.items() if v.role == "leader" and v.term == term]
    return claims[0] if len(claims) == 1 else None


def is_down(e: DLedgerError) -> bool:
    """The member did not answer (down, hung, unreachable), as opposed to answering an error."""
    return e.code in (ResponseCode.NETWORK_ERROR, ResponseCode.TIMEOUT)


def _error(e: DLedgerError) -> str:
    if is_down(e):
        return f"down ({e.message})"
    return str(e)  # "CODE (n): message"
