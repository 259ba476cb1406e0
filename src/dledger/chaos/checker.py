"""Judges a run: the history of operations against the members' final logs.

The final logs come from two places: each member's committed entries read through the
client once the group has healed and converged, and each member's store opened offline
(`FileLedgerStore`) after a clean stop, with the chain CRC of every entry. The
reference log is the store holding the highest commit index; all others must agree
with it on every index both have committed.

Violations (each names the operations or members involved):
- lost-ack:     an acknowledged append missing from the final log, or at another index/term;
- divergence:   two members with different chain CRCs (or entries) at a committed index;
- duplicate:    a body stored twice (an append applied twice);
- phantom:      a body nobody sent, or one whose append certainly failed;
- batch:        a batch appended partly, or not as consecutive indexes in order;
- changed:      two reads returning different entries for one index;
- stale-read:   a read returned an entry that is not in the final log (by index and body),
                or a fresh read in `linearizable` or `lease` mode (at the leader or a follower)
                that misses an append acknowledged before it began (the reads check; the
                same in `leader` mode is counted, not a violation: that mode may be stale);
- commit-back:  a member reported a commit index lower than one seen on it before
                (same process incarnation; a restart legitimately forgets it);
- unavailable:  no append acknowledged within the bound after the last fault healed;
- not-converged / no-catch-up: members that did not hold the same log in time;
- crash:        a member process that exited though nobody stopped it;
- unclean-stop: a member that did not exit cleanly (code 0) on SIGTERM at the end;
- store:        a store that could not be opened after the run.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger(__name__)

MAX_REPORTED = 20  # per kind: a broken run can have thousands of the same violation


@dataclass
class LogEntry:
    index: int
    term: int
    magic: int
    body: str
    chain_crc: int | None = None


@dataclass
class MemberLog:
    """One member's log as seen at the end: from its store (with chain CRCs) or through
    the client (committed NORMAL entries only)."""

    member: str
    source: str  # "store" | "client"
    committed_index: int
    begin_index: int = 0
    end_index: int = -1
    entries: dict[int, LogEntry] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["entries"] = [asdict(e) for e in sorted(self.entries.values(), key=lambda e: e.index)]
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> MemberLog:
        entries = {int(e["index"]): LogEntry(**e) for e in d.get("entries", [])}
        return MemberLog(d["member"], d["source"], d["committed_index"], d.get("begin_index", 0),
                         d.get("end_index", -1), entries, d.get("error"))


@dataclass
class FinalState:
    stores: dict[str, MemberLog] = field(default_factory=dict)
    client_views: dict[str, MemberLog] = field(default_factory=dict)
    converged: bool = True
    convergence: dict[str, Any] = field(default_factory=dict)
    converge_bound_s: float = 60.0

    def to_json(self) -> dict[str, Any]:
        return {"stores": {m: v.to_json() for m, v in self.stores.items()},
                "client_views": {m: v.to_json() for m, v in self.client_views.items()},
                "converged": self.converged, "convergence": self.convergence,
                "converge_bound_s": self.converge_bound_s}

    @staticmethod
    def from_json(d: dict[str, Any]) -> FinalState:
        return FinalState({m: MemberLog.from_json(v) for m, v in d.get("stores", {}).items()},
                          {m: MemberLog.from_json(v) for m, v in d.get("client_views", {}).items()},
                          d.get("converged", True), d.get("convergence", {}), d.get("converge_bound_s", 60.0))


@dataclass
class Violation:
    kind: str
    message: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.message}"


@dataclass
class CheckResult:
    violations: list[Violation]
    stats: dict[str, Any]
    suppressed: dict[str, int] = field(default_factory=dict)  # violations beyond MAX_REPORTED, per kind

    @property
    def ok(self) -> bool:
        return not self.violations

    def count(self, kind: str) -> int:
        return sum(1 for v in self.violations if v.kind == kind) + self.suppressed.get(kind, 0)


class _Report:
    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.per_kind: Counter[str] = Counter()
        self.suppressed: Counter[str] = Counter()

    def add(self, kind: str, message: str) -> None:
        self.per_kind[kind] += 1
        if self.per_kind[kind] > MAX_REPORTED:
            self.suppressed[kind] += 1
            return
        self.violations.append(Violation(kind, message))


def check(history: list[dict[str, Any]], final: FinalState, availability_bound_s: float = 20.0) -> CheckResult:
    """All checks; see the module docstring for what each violation means."""
    rep = _Report()
    ops = [r for r in history if r.get("kind") in ("append", "read", "meta")]
    appends = [r for r in ops if r["kind"] == "append"]
    ref, ref_member = _reference(final, rep)
    _check_members_agree(final, ref, ref_member, rep)
    _check_appends(appends, ref, rep)
    _check_reads(ops, ref, rep)
    fresh = _check_fresh_reads(ops, appends, rep)
    _check_commit_monotonic(history, ops, rep)
    avail = _check_liveness(history, appends, final, availability_bound_s, rep)
    _check_processes(history, rep)
    stats = _stats(history, ops, appends, ref, ref_member, avail)
    stats.update(fresh)
    return CheckResult(rep.violations, stats, dict(rep.suppressed))


# --- the reference log and agreement between members ------------------------------------------------------


def _normal(log_: MemberLog, upto: int | None = None) -> dict[int, tuple[int, str]]:
    lim = log_.committed_index if upto is None else upto
    return {i: (e.term, e.body) for i, e in log_.entries.items() if i <= lim and e.magic == 1}


def _reference(final: FinalState, rep: _Report) -> tuple[dict[int, tuple[int, str]], str | None]:
    """index -> (term, body) of committed NORMAL entries of the most advanced store
    (through the client when no store could be read)."""
    for m, s in final.stores.items():
        if s.error:
            rep.add("store", f"{m}: store could not be read after the run: {s.error}")
    candidates = [s for s in final.stores.values() if not s.error]
    if not candidates:
        candidates = [v for v in final.client_views.values() if not v.error]
    if not candidates:
        return {}, None
    best = max(candidates, key=lambda s: s.committed_index)
    return _normal(best), best.member


def _check_members_agree(final: FinalState, ref: dict[int, tuple[int, str]], ref_member: str | None,
                         rep: _Report) -> None:
    stores = [s for s in final.stores.values() if not s.error]
    for i, a in enumerate(stores):
        for b in stores[i + 1:]:
            upto = min(a.committed_index, b.committed_index)
            for idx in range(max(a.begin_index, b.begin_index), upto + 1):
                ea, eb = a.entries.get(idx), b.entries.get(idx)
                if ea is None or eb is None:
                    rep.add("divergence", f"stores of {a.member} and {b.member}: committed index {idx} missing "
                            f"from {a.member if ea is None else b.member}")
                    break
                if ea.chain_crc != eb.chain_crc:
                    rep.add("divergence", f"stores of {a.member} and {b.member} differ at committed index {idx}: "
                            f"chain CRC {ea.chain_crc} (term {ea.term}, {ea.body!r}) vs {eb.chain_crc} "
                            f"(term {eb.term}, {eb.body!r}); both committed through {upto}")
                    break
    for view in final.client_views.values():
        if view.error:
            continue
        for idx, (term, body) in sorted(_normal(view).items()):
            if ref.get(idx) != (term, body):
                rep.add("divergence", f"{view.member} (through the client) holds committed index {idx} as "
                        f"(term {term}, {body!r}); the final log of {ref_member} has {ref.get(idx)!r}")
                break


# --- appends ------------------------------------------------------------------------------------------------


def _check_appends(appends: list[dict[str, Any]], ref: dict[int, tuple[int, str]], rep: _Report) -> None:
    where: dict[str, list[int]] = defaultdict(list)
    for idx, (_, body) in ref.items():
        where[body].append(idx)
    sent: dict[str, dict[str, Any]] = {}
    for op in appends:
        for b in op["request"]["bodies"]:
            sent[b] = op
    for body, idxs in where.items():
        sender = sent.get(body)
        if len(idxs) > 1:
            rep.add("duplicate", f"body {body!r} is stored at indexes {sorted(idxs)} "
                    f"(op {sender['id'] if sender else None})")
        if sender is None:
            rep.add("phantom", f"index {idxs[0]} holds {body!r}, which no client sent")
        elif sender["outcome"] == "fail":
            rep.add("phantom", f"index {idxs[0]} holds {body!r}, whose append failed with {sender['error']} "
                    f"(op {sender['id']}, client {sender['client']}, "
                    f"{sender['invoke']:.3f}-{sender['complete']:.3f} s)")
    for op in appends:
        bodies: list[str] = op["request"]["bodies"]
        if op["outcome"] == "ok":
            for body, (idx, term) in zip(bodies, op["result"], strict=True):
                got = ref.get(idx)
                if got != (term, body):
                    elsewhere = [i for i in where.get(body, []) if i != idx]
                    rep.add("lost-ack", f"op {op['id']} (client {op['client']}, acknowledged at "
                            f"{op['complete']:.3f} s): {body!r} acknowledged at index {idx} term {term}; "
                            f"the final log has {got!r} there"
                            + (f", and the body at {elsewhere}" if elsewhere else ", and the body nowhere"))
        present = [where[b][0] for b in bodies if b in where]
        if present and len(present) != len(bodies):
            rep.add("batch", f"op {op['id']} ({op['outcome']}): {len(present)} of {len(bodies)} bodies of one batch "
                    f"are stored (at {present})")
        elif present and present != list(range(present[0], present[0] + len(present))):
            rep.add("batch", f"op {op['id']}: the bodies of one batch are stored at {present}, not in order")


# --- reads --------------------------------------------------------------------------------------------------


def _check_reads(ops: list[dict[str, Any]], ref: dict[int, tuple[int, str]], rep: _Report) -> None:
    seen: dict[int, tuple[int, str, int]] = {}  # index -> (term, body, op id) as first read
    for op in ops:
        if op["kind"] != "read" or op["outcome"] != "ok":
            continue
        last = -1
        for idx, term, body in op["result"]["entries"]:
            if idx <= last:
                rep.add("stale-read", f"op {op['id']}: read returned index {idx} after {last}")
            last = idx
            first = seen.setdefault(idx, (term, body, op["id"]))
            if (first[0], first[1]) != (term, body):
                rep.add("changed", f"committed index {idx} read as (term {first[0]}, {first[1]!r}) by op {first[2]} "
                        f"and as (term {term}, {body!r}) by op {op['id']} (client {op['client']}, "
                        f"member {op['request']['member']})")
            if ref.get(idx) != (term, body):
                rep.add("stale-read", f"op {op['id']} (client {op['client']}, member {op['request']['member']}, "
                        f"{op['invoke']:.3f}-{op['complete']:.3f} s) read (index {idx}, term {term}, {body!r}) "
                        f"as committed; the final log has {ref.get(idx)!r}")


def check_fresh_reads(history: list[dict[str, Any]]) -> CheckResult:
    """The reads check alone (no final logs needed): for a history of appends and fresh reads."""
    rep = _Report()
    ops = [r for r in history if r.get("kind") in ("append", "read")]
    stats = _check_fresh_reads(ops, [op for op in ops if op["kind"] == "append"], rep)
    return CheckResult(rep.violations, stats, dict(rep.suppressed))


def _check_fresh_reads(ops: list[dict[str, Any]], appends: list[dict[str, Any]], rep: _Report) -> dict[str, Any]:
    """A read that begins after an append was acknowledged, or after a linearizable or lease
    read returned an entry, must include it: its entries reach at least that index (a read that
    starts past it, or is capped by its entry count, proves nothing and is skipped)."""
    seen = [(op["complete"], max(i for i, _ in op["result"])) for op in appends if op["outcome"] == "ok"]
    # real-time order between reads too: what a linearizable read saw, a later one must see
    seen += [(op["complete"], max(e[0] for e in op["result"]["entries"])) for op in ops
             if op["kind"] == "read" and op["outcome"] == "ok" and op["request"].get("mode") not in (None, "leader")
             and op["result"]["entries"]]
    acked = sorted(seen)
    times = [t for t, _ in acked]
    tops = list(itertools.accumulate((i for _, i in acked), max))
    served: Counter[str] = Counter()
    stale_leader = 0
    for op in ops:
        mode = op["request"].get("mode") if op["kind"] == "read" else None
        if not mode or op["outcome"] != "ok":
            continue
        served[mode] += 1
        k = bisect.bisect_left(times, op["invoke"])
        must = tops[k - 1] if k else -1
        entries = op["result"]["entries"]
        last = max((e[0] for e in entries), default=-1)
        if must < op["request"]["from"] or last >= must or len(entries) >= op["request"]["max"]:
            continue  # (a read from past that index, or capped, proves nothing about it)
        if mode == "leader":
            stale_leader += 1
            continue
        rep.add("stale-read", f"op {op['id']} ({mode} read, client {op['client']}, member {op['request']['member']}, "
                f"{op['invoke']:.3f}-{op['complete']:.3f} s) reached index {last}; append at {must} was "
                "acknowledged before it began")
    return {"fresh_reads": dict(sorted(served.items())), "stale_leader_mode_reads": stale_leader}


def _boundaries(history: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per member, the times its process was killed, crashed, stopped or started."""
    out: dict[str, list[float]] = defaultdict(list)
    for r in history:
        if r.get("kind") == "process" and r.get("event") in ("killing", "killed", "crashed", "stopped", "started"):
            out[r["member"]].append(float(r["time"]))
    for v in out.values():
        v.sort()
    return out


def _check_commit_monotonic(history: list[dict[str, Any]], ops: list[dict[str, Any]], rep: _Report) -> None:
    """Within one process incarnation a member's commit index never goes back: a metadata
    read must not report less than what an earlier completed operation saw on that member."""
    bounds = _boundaries(history)
    obs: dict[tuple[str, int], list[tuple[float, float, int, bool, dict[str, Any]]]] = defaultdict(list)
    for op in ops:
        if op["outcome"] != "ok" or op["kind"] not in ("read", "meta"):
            continue
        member = op["request"].get("member")
        if member is None:
            continue
        b = bounds.get(member, [])
        inc = bisect.bisect_right(b, op["invoke"])
        if inc != bisect.bisect_right(b, op["complete"]):
            continue  # the member was killed or restarted meanwhile: which process answered is unclear
        if op["kind"] == "meta":
            value, exact = int(op["result"]["committed_index"]), True
        else:
            entries = op["result"]["entries"]
            if not entries:
                continue
            value, exact = int(entries[-1][0]), False
        obs[(member, inc)].append((op["invoke"], op["complete"], value, exact, op))
    for (member, _), items in obs.items():
        by_complete = sorted(items, key=lambda x: x[1])
        best: tuple[int, dict[str, Any]] | None = None
        k = 0
        for invoke, _complete, value, exact, op in sorted(items, key=lambda x: x[0]):
            while k < len(by_complete) and by_complete[k][1] < invoke:
                if best is None or by_complete[k][2] > best[0]:
                    best = (by_complete[k][2], by_complete[k][4])
                k += 1
            if exact and best is not None and value < best[0]:
                prev = best[1]
                rep.add("commit-back", f"{member}: op {op['id']} (client {op['client']}, at {invoke:.3f} s) saw "
                        f"committed_index {value}, but op {prev['id']} (client {prev['client']}, done at "
                        f"{prev['complete']:.3f} s) had seen {best[0]} on the same process")


# --- liveness, processes ---------------------------------------------------------------------------------------


def _check_liveness(history: list[dict[str, Any]], appends: list[dict[str, Any]], final: FinalState,
                    bound: float, rep: _Report) -> dict[str, Any]:
    heals = [r["time"] for r in history if r.get("kind") == "nemesis" and r.get("fault") == "heal-all"]
    out: dict[str, Any] = {"healed_at": heals[-1] if heals else None, "first_ack_after_heal_s": None}
    if heals:
        t = heals[-1]
        after = [op["complete"] for op in appends if op["outcome"] == "ok" and op["complete"] >= t]
        if after:
            out["first_ack_after_heal_s"] = round(min(after) - t, 3)
        if not after or min(after) - t > bound:
            rep.add("unavailable", f"no append was acknowledged within {bound:.0f} s after the last fault healed "
                    f"(at {t:.3f} s)" + (f"; the first came {min(after) - t:.1f} s after" if after else ""))
    if not final.converged:
        rep.add("not-converged", f"the members did not hold and commit the same log within "
                f"{final.converge_bound_s:.0f} s after healing: {final.convergence}")
    for r in history:
        torn_end = r.get("kind") == "nemesis" and r.get("fault") == "torn-write" and r.get("phase") == "end"
        if torn_end and not r["detail"].get("caught_up", True):
            rep.add("no-catch-up", f"{r['members'][0]} did not catch up within "
                    f"{r['detail'].get('catch_up_s')} s after its torn-write restart (at {r['time']:.3f} s)")
    return out


def _check_processes(history: list[dict[str, Any]], rep: _Report) -> None:
    for r in history:
        if r.get("kind") == "process" and r.get("event") == "stopped" and r["detail"].get("returncode"):
            how = "did not stop on SIGTERM in time" if r["detail"].get("forced") else "stopped uncleanly"
            rep.add("unclean-stop", f"{r['member']} {how}: exit code {r['detail']['returncode']}")
        if r.get("kind") == "process" and r.get("event") == "crashed":
            tail = str(r.get("detail", {}).get("log_tail", "")).strip().splitlines()[-3:]
            rep.add("crash", f"{r['member']} exited with code {r['detail'].get('returncode')} at {r['time']:.3f} s "
                    f"though nobody stopped it; log ends: {' | '.join(tail)}")


# --- statistics ---------------------------------------------------------------------------------------------------


def _stats(history: list[dict[str, Any]], ops: list[dict[str, Any]], appends: list[dict[str, Any]],
           ref: dict[int, tuple[int, str]], ref_member: str | None, avail: dict[str, Any]) -> dict[str, Any]:
    outcomes = Counter(f"{op['kind']}:{op['outcome']}" for op in ops)
    stored = {body for _, body in ref.values()}
    maybe = [op for op in appends if op["outcome"] == "maybe"]
    maybe_in = sum(1 for op in maybe if any(b in stored for b in op["request"]["bodies"]))
    faults = Counter(r["fault"] for r in history
                     if r.get("kind") == "nemesis" and r.get("phase") == "start")
    acked = [op for op in appends if op["outcome"] == "ok"]
    gap, gap_at = _longest_gap(ops, acked)
    return {
        "operations": len(ops),
        "outcomes": dict(sorted(outcomes.items())),
        "acknowledged_appends": len(acked),
        "acknowledged_entries": sum(len(op["request"]["bodies"]) for op in acked),
        "maybe_appends": len(maybe),
        "maybe_appends_applied": maybe_in,
        "faults": dict(sorted(faults.items())),
        "faults_total": sum(faults.values()),
        "final_log_entries": len(ref),
        "final_log_from": ref_member,
        "longest_unavailability_s": gap,
        "longest_unavailability_at": gap_at,
        **avail,
    }


def _longest_gap(ops: list[dict[str, Any]], acked: list[dict[str, Any]]) -> tuple[float, list[float] | None]:
    """Longest time without an acknowledged append, from the first operation to the last."""
    if not ops:
        return 0.0, None
    start = min(op["invoke"] for op in ops)
    end = max(op["complete"] for op in ops)
    times = [start, *sorted(op["complete"] for op in acked), end]
    best, at = 0.0, None
    for a, b in itertools.pairwise(times):
        if b - a > best:
            best, at = b - a, [round(a, 3), round(b, 3)]
    return round(best, 3), at


def format_summary(result: CheckResult, title: str = "", per_kind: int = 5) -> str:
    s = result.stats
    faults = ", ".join(f"{k} {v}" for k, v in s["faults"].items()) or "none"
    lines = [
        f"{title}" if title else "",
        f"  operations: {s['operations']} ({', '.join(f'{k} {v}' for k, v in s['outcomes'].items())})",
        f"  acknowledged: {s['acknowledged_appends']} appends, {s['acknowledged_entries']} entries; "
        f"unknown outcome: {s['maybe_appends']} ({s['maybe_appends_applied']} of them applied); "
        f"final log: {s['final_log_entries']} entries",
        f"  faults injected: {s['faults_total']} ({faults})",
        f"  longest unavailability: {s['longest_unavailability_s']:.1f} s (at {s['longest_unavailability_at']}); "
        f"first ack after the last heal: {s['first_ack_after_heal_s']} s",
        f"  fresh reads: {s.get('fresh_reads', {})}; stale in leader mode (allowed): "
        f"{s.get('stale_leader_mode_reads', 0)}",
        f"  violations: {sum(result.count(k) for k in {v.kind for v in result.violations})}",
    ]
    shown: Counter[str] = Counter()
    for v in result.violations:  # a few of each kind; summary.json keeps MAX_REPORTED per kind
        shown[v.kind] += 1
        if shown[v.kind] <= per_kind:
            lines.append(f"    {v}")
    for k, n in shown.items():
        if result.count(k) > min(n, per_kind):
            lines.append(f"    ... and {result.count(k) - min(n, per_kind)} more [{k}]")
    return "\n".join(line for line in lines if line)
