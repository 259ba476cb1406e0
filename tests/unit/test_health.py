"""The health verdict (dledger.health) from members' views."""

from __future__ import annotations

from dledger.codes import DLedgerError, ResponseCode
from dledger.health import assess
from dledger.runtime.client import Metadata

MEMBERS = ["n0", "n1", "n2"]


def view(member: str, role: str = "follower", term: int = 7, end: int = 100, commit: int = 100,
         leader: str = "n1", **kw: object) -> Metadata:
    return Metadata(leader, term, MEMBERS, end, commit, role, member, **kw)  # type: ignore[arg-type]


def healthy_views() -> dict[str, Metadata | DLedgerError]:
    return {"n0": view("n0", end=90), "n1": view("n1", "leader", end=102, commit=100), "n2": view("n2")}


def test_a_whole_group_is_healthy_with_a_one_line_summary() -> None:
    h = assess(healthy_views())
    assert h.ok and h.summary == "leader n1, term 7, 3/3 up, max lag 10 entries" and not h.problems


def test_a_member_down_a_lagging_one_or_no_leader_is_not_healthy() -> None:
    views = healthy_views()
    views["n2"] = DLedgerError(ResponseCode.NETWORK_ERROR, "connect refused")
    h = assess(views)
    assert not h.ok and h.up == 2 and "n2: down (connect refused)" in h.summary
    assert not assess(healthy_views(), max_lag=5).ok  # n0 trails by 10
    views = healthy_views()
    views["n1"] = view("n1", "candidate", term=8)  # a new term, nobody leads it yet
    h = assess(views)
    assert not h.ok and h.leader is None and h.summary.startswith("no leader")
    views = healthy_views()
    views["n0"] = view("n0", store_error="disk full")
    assert not assess(views).ok


def test_the_real_error_is_kept() -> None:
    views: dict[str, Metadata | DLedgerError] = {
        m: DLedgerError(ResponseCode.UNKNOWN_GROUP, f"{m}: no group 'x' here") for m in MEMBERS}
    h = assess(views)
    assert not h.ok and "UNKNOWN_GROUP (400)" in h.summary and "no quorum" in h.problems[-1]


def test_a_member_astray_or_not_asked_is_not_healthy() -> None:
    views = healthy_views()
    views["n0"] = view("n0", "candidate", leader="")  # cut off: pre-vote keeps its term
    h = assess(views)
    assert not h.ok and "n0: candidate in term 7, following nobody" in h.problems
    views = healthy_views()
    views["n2"] = view("n2", term=6, leader="n0")  # a stale view
    assert not assess(views).ok
    views = healthy_views()
    views["n0"] = view("n0", "leader", term=6, leader="n0")  # deposed, still claiming
    assert not assess(views).ok
    partial: dict[str, Metadata | DLedgerError] = {"n1": view("n1", "leader", end=102)}  # --peers named one
    h = assess(partial)
    assert not h.ok and "n0: not asked (not in --peers; the members name it)" in h.problems


def test_an_insecure_member_is_named_in_the_verdict() -> None:
    """--insecure is healthy (the group works) but said in the one line and in JSON."""
    views = healthy_views()
    views["n2"] = view("n2", security="insecure")
    h = assess(views)
    assert h.ok and h.insecure == ["n2"] and "INSECURE (n2 run --insecure" in h.line
    assert h.as_json()["insecure"] == ["n2"]
    assert assess({m: view(m, "leader" if m == "n1" else "follower", security="tls")
                   for m in MEMBERS}).insecure == []
