"""`dledger members` and `dledger server --join` (docs/operations.md): parsing, printing, and
the health verdict of a group with learners. The membership requests themselves run against
real processes in tests/integration/test_membership.py."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dledger.cli import cli
from dledger.clitools import UserError
from dledger.codes import DLedgerError
from dledger.health import assess
from dledger.members_command import configuration_of, join_configuration, member_rows, members_json
from dledger.membership import Membership
from dledger.ports import free_ports
from dledger.runtime.client import Member, Members, Metadata

CONFIG = Members("n1", 7, 12, True, [Member("n0", "127.0.0.1:1", True, 40, 2),
                                     Member("n3", "127.0.0.1:4", False, 10, 32),
                                     Member("n1", "127.0.0.1:2", True, 42, 0, leader=True)], "n1")


def test_a_configuration_prints_voters_first_with_the_leader_marked() -> None:
    rows = member_rows(CONFIG)
    assert [r["id"] for r in rows] == ["n0", "n1", "n3"]
    assert rows[1] == {"id": "n1", "address": "127.0.0.1:2", "role": "voter", "match": 42, "lag": 0, "leader": "*"}
    assert rows[2]["role"] == "learner" and rows[2]["lag"] == 32
    follower_view = Members("n1", 7, 12, False, [Member("n0", "127.0.0.1:1", True)], "n0")
    assert member_rows(follower_view)[0]["lag"] == ""  # unknown off the leader: blank, not -1
    doc = members_json(CONFIG)
    assert doc["config_index"] == 12 and doc["committed"] is True and doc["leader"] == "n1"
    listed = doc["members"]
    assert isinstance(listed, list) and [m["id"] for m in listed] == ["n0", "n1", "n3"]
    json.dumps(doc)
    assert CONFIG.peers_string() == "n0-127.0.0.1:1;n1-127.0.0.1:2;n3-127.0.0.1:4"


@pytest.mark.parametrize(("args", "said"), [
    (["members", "add-learner", "--peers", "n0-127.0.0.1:1", "--id", "n3"], "--addr"),
    (["members", "add-learner", "--peers", "n0-127.0.0.1:1", "--id", "n3", "--addr", "nowhere"], "n3"),
    (["members", "promote", "--peers", "n0-127.0.0.1:1"], "--id"),
    (["members", "remove", "--peers", "n0-127.0.0.1:1"], "--id"),
    (["members", "list"], "--peers"),
    (["server", "--join", "n0-127.0.0.1:1", "--peers", "n0-127.0.0.1:1", "--id", "n3"], "without --peers"),
    (["server", "--join", "n0-127.0.0.1:1"], "--id"),
    (["server", "--join", "n0-127.0.0.1:1", "--id", "n3", "--peer-listen", "n3-127.0.0.1:9"], "--peer-listen"),
])
def test_usage_errors_name_what_is_missing(args: list[str], said: str) -> None:
    res = CliRunner().invoke(cli, args, env={"DLEDGER_PEERS": ""})
    assert res.exit_code == 2, res.output
    assert said in res.output


def test_a_join_through_nobody_reachable_fails_with_one_line() -> None:
    (port,) = free_ports(1)  # nothing listens there
    with pytest.raises(UserError, match="cannot read group default's configuration"):
        join_configuration(f"n0-127.0.0.1:{port}", "default", "n3", {}, wait=0.5)


def test_a_members_answer_becomes_the_configuration_a_joining_node_starts_from() -> None:
    m = configuration_of(CONFIG)
    assert m == Membership({"n0": "127.0.0.1:1", "n1": "127.0.0.1:2"}, {"n3": "127.0.0.1:4"})
    assert m.peers_string() == CONFIG.peers_string()  # the command line's fallback names the same members


def _view(member: str, role: str = "follower", end: int = 100) -> Metadata:
    return Metadata("n1", 7, ["n0", "n1", "n2", "n3"], end, 100, role, member)


def test_learners_are_judged_like_members_but_the_quorum_is_the_voters() -> None:
    views: dict[str, Metadata | DLedgerError] = {"n0": _view("n0"), "n1": _view("n1", "leader"),
                                                 "n2": _view("n2"), "n3": _view("n3", "learner", end=95)}
    h = assess(views, learners={"n3"})
    assert h.ok and "(learners: n3)" in h.summary and h.as_json()["learners"] == ["n3"]
    assert not assess(views, max_lag=2, learners={"n3"}).ok  # a learner far behind: not healthy
    views["n0"] = DLedgerError(503, "down")  # type: ignore[arg-type]
    views["n2"] = DLedgerError(503, "down")  # type: ignore[arg-type]
    h = assess(views, learners={"n3"})
    assert not h.ok and "only 1 of 3 voters answer" in " ".join(h.problems)  # n3 does not make a quorum
