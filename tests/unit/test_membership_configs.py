"""The configuration history and the CONFIG_CHANGE body, without a Node (core.configs,
dledger.membership): a configuration is in force once its entry is in the log, a truncate
takes it back, a committed one stays; older snapshots' peers strings still read."""

from __future__ import annotations

import msgspec
import pytest

from dledger.core.configs import ConfigHistory
from dledger.entry import MAGIC_CONFIG_CHANGE, MAGIC_NORMAL
from dledger.membership import Membership, decode_membership, encode_membership, membership_of
from dledger.statemachine.snapshot import SnapshotMeta
from dledger.store.memory import MemoryLedgerStore

THREE = Membership({"n0": "h:1", "n1": "h:2", "n2": "h:3"})
WITH_LEARNER = Membership(THREE.voters, {"n3": "h:4"})
FOUR = Membership({**THREE.voters, "n3": "h:4"})


def _log(*entries: Membership | None) -> MemoryLedgerStore:
    """A log of term 1: None a NORMAL entry, a Membership its CONFIG_CHANGE entry."""
    store = MemoryLedgerStore(1 << 20)
    for e in entries:
        if e is None:
            store.append_as_leader([b"x"], 1, MAGIC_NORMAL)
        else:
            store.append_as_leader([encode_membership(e)], 1, MAGIC_CONFIG_CHANGE)
    return store


def test_the_body_is_the_whole_configuration_and_round_trips() -> None:
    body = encode_membership(WITH_LEARNER)
    assert decode_membership(body) == WITH_LEARNER
    assert WITH_LEARNER.members == {"n0": "h:1", "n1": "h:2", "n2": "h:3", "n3": "h:4"}
    assert WITH_LEARNER.quorum == 2 and FOUR.quorum == 3  # learners never count
    with pytest.raises(msgspec.DecodeError):
        decode_membership(b"\x92\x01")


def test_a_configuration_is_in_force_once_appended_committed_or_not() -> None:
    store = _log(None, None)
    h = ConfigHistory(-1, THREE)
    store.append_as_leader([encode_membership(WITH_LEARNER)], 1, MAGIC_CONFIG_CHANGE)
    assert h.appended(store, 2, 2)
    assert h.current == WITH_LEARNER and h.index == 2
    assert store.committed_index < 2  # nothing committed: in force all the same
    assert h.committed(store.committed_index) == (-1, THREE)


def test_a_truncate_takes_the_configuration_back() -> None:
    store = _log(None, WITH_LEARNER, None, FOUR)
    h = ConfigHistory(-1, THREE)
    h.appended(store, 0, store.end_index)
    assert h.current == FOUR and h.index == 3
    assert h.truncated(3)  # entries 3.. removed: the one before is in force again
    assert (h.index, h.current) == (1, WITH_LEARNER)
    assert not h.truncated(5)
    assert h.truncated(0)  # the base (committed, or the command line's) is never taken back
    assert (h.index, h.current) == (-1, THREE)


def test_the_committed_configuration_is_the_newest_at_or_below_the_commit_index() -> None:
    store = _log(None, WITH_LEARNER, None, FOUR)
    h = ConfigHistory(-1, THREE)
    h.appended(store, 0, store.end_index)
    assert h.committed(0) == (-1, THREE)
    assert h.committed(2) == (1, WITH_LEARNER)
    assert h.committed(9) == (3, FOUR)
    h.forget_before(2)  # keeps what the commit point needs, and everything after
    assert h.committed(2) == (1, WITH_LEARNER) and h.current == FOUR and len(h) == 2
    assert h.known("n3") and not h.known("n9")


def test_an_older_snapshots_peers_string_reads_as_all_voters() -> None:
    meta = SnapshotMeta(5, 1, 0, "n0-127.0.0.1:1;n1-127.0.0.1:2")
    assert membership_of(meta.members, THREE) == Membership({"n0": "127.0.0.1:1", "n1": "127.0.0.1:2"})
    assert membership_of("", THREE) == THREE
    raw = msgspec.json.encode(SnapshotMeta(5, 1, 0, WITH_LEARNER, config_index=4))
    back = msgspec.json.decode(raw, type=SnapshotMeta)
    assert back.members == WITH_LEARNER and back.config_index == 4
    old = msgspec.json.decode(b'{"last_index":5,"last_term":1,"chain_crc":0,"members":"n0-h:1"}', type=SnapshotMeta)
    assert old.members == "n0-h:1" and old.config_index == -1
