"""Broker liveness on one controller (upstream's DefaultBrokerHeartbeatManagerTest) and the controller's own settings,
without a network: time is passed in."""

from __future__ import annotations

import pytest

from dledger.config import ConfigError
from dledger.controller import messages as m
from dledger.controller.config import ControllerConfig
from dledger.controller.elect_policy import LiveInfo
from dledger.controller.heartbeats import MAX_PER_SET, HeartbeatTable
from dledger.controller.liveness import Liveness
from dledger.controller.machine import BrokerSetBrief


def test_alive_until_its_own_timeout_or_the_default() -> None:
    t = HeartbeatTable(default_timeout_ms=1500)
    t.beat("c", "b", 1, "h:1", 1000)
    t.beat("c", "b", 2, "h:2", 1000, timeout_ms=3000)
    assert t.alive("b", 1, 2500) and not t.alive("b", 1, 2501)
    assert t.alive("b", 2, 4000) and not t.alive("b", 2, 4001)
    assert t.live_infos("b", 3000) == {2: LiveInfo(-1, -1)}
    assert t.expire(4001) == [("b", 1), ("b", 2)] and t.brokers == {}
    assert t.max_timeout_ms == 1500


def test_epoch_and_offset_only_move_forward() -> None:
    """A late heartbeat from before a truncation must not make a replica look more up to date;
    its priority is taken whatever."""
    t = HeartbeatTable(1500)
    t.beat("c", "b", 1, "h", 0, epoch=3, max_offset=100, priority=5)
    t.beat("c", "b", 1, "h", 10, epoch=2, max_offset=900, priority=4)
    assert t.live_infos("b", 10)[1] == LiveInfo(3, 100, 4)
    t.beat("c", "b", 1, "h", 20, epoch=3, max_offset=150)
    assert t.live_infos("b", 20)[1].max_offset == 150


def test_a_report_at_a_newer_view_replaces_the_old_one_whatever_it_says() -> None:
    """A master restarted after a flush=async power loss reports less than it did before;
    once it reports at the master epoch its registration made (its view), its old report
    no longer ranks it. An older view changes nothing (its first heartbeats, before it
    registered, say -1)."""
    t = HeartbeatTable(1500)
    t.beat("c", "b", 1, "h", 0, epoch=1, max_offset=900, view=1)
    t.beat("c", "b", 1, "h", 10, epoch=1, max_offset=600)  # restarted, not registered yet
    assert t.live_infos("b", 10)[1] == LiveInfo(1, 900, view=1)
    t.beat("c", "b", 1, "h", 20, epoch=1, max_offset=600, view=2)
    assert t.live_infos("b", 20)[1] == LiveInfo(1, 600, view=2)
    t.beat("c", "b", 1, "h", 30, epoch=1, max_offset=500, view=2)  # late, same view: forward only
    assert t.live_infos("b", 30)[1] == LiveInfo(1, 600, view=2)


def test_a_closed_connection_evicts_only_the_brokers_that_last_beat_on_it() -> None:
    """#11045: upstream never rebound the channel, so a stale channel's close evicted a broker
    that had reconnected, and triggered an election."""
    t = HeartbeatTable(1500)
    old, new = object(), object()
    t.beat("c", "b", 1, "h", 0, conn=old)
    t.beat("c", "b", 2, "h", 0, conn=old)
    t.beat("c", "b", 1, "h", 5, conn=new)  # broker 1 reconnected
    assert t.connection_closed(old, 10) == [("b", 2)]
    assert t.alive("b", 1, 10) and not t.alive("b", 2, 10)
    assert t.connection_closed(new, 10) == [("b", 1)]


def test_a_heartbeat_forged_on_another_connection_then_closed_evicts_nobody() -> None:
    """Issue 26: a heartbeat for the master on the attacker's own connection, then closed,
    evicted the master at once. Its own connection is still open: it stays, and stays home."""
    t = HeartbeatTable(1500)
    real, forged = object(), object()
    t.beat("c", "b", 1, "h", 0, conn=real)
    t.beat("c", "b", 1, "h", 5, conn=forged)
    assert t.beats_on("b", 1, real) and not t.beats_on("b", 1, forged)
    assert t.connection_closed(forged, 10) == []
    assert t.alive("b", 1, 10) and t.beats_on("b", 1, real)
    assert t.connection_closed(real, 20) == [("b", 1)]


def test_the_home_connection_moves_only_when_it_closes() -> None:
    """A broker that reconnected: its requests are taken on the new connection once the old
    one closed (until then on the old one, where its heartbeats came first)."""
    t = HeartbeatTable(1500)
    old, new = object(), object()
    t.beat("c", "b", 1, "h", 0, conn=old)
    t.beat("c", "b", 1, "h", 5, conn=new)
    assert t.beats_on("b", 1, old)
    assert t.connection_closed(old, 10) == []
    assert t.beats_on("b", 1, new) and not t.beats_on("b", 1, old)
    assert not t.beats_on("b", 2, new)


def test_a_lease_asked_for_is_held_whatever_follows() -> None:
    """Issue 26: a closed connection, a heartbeat saying lease_ms=0, or one forged on another
    connection and closed never end a lease before its time (lease + drift after the heartbeat
    that asked for it); `held_until` never moves back."""
    t = HeartbeatTable(1500, lease_drift_ms=200)
    real, forged = object(), object()
    t.beat("c", "b", 1, "h", 1000, conn=real, lease_ms=1000)
    t.beat("c", "b", 1, "h", 1100, conn=forged, lease_ms=0)  # forged: no lease asked
    assert t.connection_closed(forged, 1150) == []
    assert t.connection_closed(real, 1160) == []  # the master's process is gone, its lease is not
    assert t.alive("b", 1, 2200) and not t.alive("b", 1, 2201)
    assert t.brokers[("b", 1)].held_until == 2200
    t.beat("c", "b", 1, "h", 1170, conn=forged, lease_ms=0)  # a forged beat reopens it: still held
    assert t.connection_closed(forged, 1180) == []
    assert t.brokers[("b", 1)].held_until == 2200 and not t.alive("b", 1, 2201)
    assert t.expire(2201) == [("b", 1)]


def test_the_table_is_bounded_per_set() -> None:
    t = HeartbeatTable(1500)
    for i in range(MAX_PER_SET):
        assert t.beat("c", "flood", i, "h", 0)
    assert not t.beat("c", "flood", MAX_PER_SET, "h", 0)
    assert t.beat("c", "flood", 0, "h", 1)  # a known broker still beats
    assert t.beat("c", "other", 1, "h", 1)
    t.expire(10_000)
    assert t.beat("c", "flood", MAX_PER_SET, "h", 10_000)


def test_controller_config() -> None:
    with pytest.raises(ConfigError, match="unknown controller configuration keys: nope"):
        ControllerConfig.from_dict({"nope": 1})
    with pytest.raises(ConfigError, match="positive"):
        ControllerConfig(scan_interval_ms=0)
    with pytest.raises(ConfigError, match="true or false"):
        ControllerConfig(enable_elect_unclean_master=1)  # type: ignore[arg-type]
    c = ControllerConfig().updated("# tuned\nscan_interval_ms = 100\nnotify_broker_role_changed=false\n")
    assert (c.scan_interval_ms, c.notify_broker_role_changed) == (100, False)
    with pytest.raises(PermissionError):
        c.updated("config_store_path=/tmp")
    with pytest.raises(PermissionError):  # an admin may not switch on what may lose acknowledged data
        c.updated("enable_elect_unclean_master=true")
    for bad in ("nope=1", "scan_interval_ms", "scan_interval_ms=x", "notify_broker_role_changed=maybe",
                "scan_interval_ms=-5"):
        with pytest.raises(ConfigError):
            c.updated(bad)


def _liveness() -> Liveness:
    lv = Liveness(ControllerConfig(broker_heartbeat_timeout_ms=1500, broker_lease_drift_ms=200))
    lv.note_master("b", 1, 1)
    return lv


def _beat(lv: Liveness, broker_id: int, now: int, conn: object, lease_ms: int = 0) -> bool:
    hb = m.BrokerHeartbeat("c", f"h:{broker_id}", "b", broker_id, epoch=1, lease_ms=lease_ms)
    return lv.heartbeat(hb, now, conn, leader_sure=True).lease_granted


BRIEF = BrokerSetBrief("b", 1, 1, frozenset({1, 2}), frozenset({1, 2}))


def test_no_election_while_a_granted_lease_may_hold() -> None:
    """Issue 26: a forged heartbeat (lease_ms=0) on the attacker's connection, then closed,
    made the controller fail the master over at once, inside its lease: two masters. The lease
    granted at 1000 (1000 ms + 200 ms drift) holds the set until 2200, whatever the table says."""
    lv = _liveness()
    real, forged, slave = object(), object(), object()
    assert _beat(lv, 1, 1000, real, lease_ms=1000)
    _beat(lv, 2, 1000, slave)
    assert lv.lease_wait("b", 1000) == 1200
    _beat(lv, 1, 1100, forged)
    lv.table.connection_closed(forged, 1100)
    lv.table.connection_closed(real, 1100)  # and the master's process is gone too
    _beat(lv, 2, 1500, slave)
    assert not lv.needs_election(BRIEF, 1500)
    lv.table._drop([("b", 1)])  # even a table that lost the master: the lease still decides
    _beat(lv, 2, 2100, slave)
    assert not lv.needs_election(BRIEF, 2199)
    assert lv.needs_election(BRIEF, 2201)


def test_a_lease_end_never_moves_back() -> None:
    lv = _liveness()
    assert _beat(lv, 1, 1000, "a", lease_ms=1000)
    _beat(lv, 1, 1100, "a")  # the master's own heartbeat without a lease (it lost mastership, say)
    assert _beat(lv, 1, 1050, "a", lease_ms=100) and lv.lease_wait("b", 1100) == 1100


def test_which_election_may_go_while_a_lease_holds() -> None:
    """Only one that keeps the lease holder: not an admin's (it names another), and only with
    the holder alive in its facts (the policy keeps a live old master)."""
    lv = _liveness()
    assert _beat(lv, 1, 1000, "a", lease_ms=1000)
    alive, gone = {1: LiveInfo(), 2: LiveInfo()}, {2: LiveInfo()}
    assert lv.election_wait("b", alive, False, 1100) == 0
    assert lv.election_wait("b", gone, False, 1100) == 1100
    assert lv.election_wait("b", alive, True, 1100) == 1100
    assert lv.revoke("b", 1100) == 1100
    assert not _beat(lv, 1, 1200, "a", lease_ms=1000)  # revoked: no more grants in the set
    assert lv.election_wait("b", gone, False, 2200) == 0


def test_a_set_the_state_no_longer_holds_gets_no_lease() -> None:
    """An admin cleaned a live set: the controller went on granting its old master leases."""
    lv = _liveness()
    assert _beat(lv, 1, 1000, "c1", lease_ms=1000)
    lv.keep_only({"other"})  # the scan: the state holds no set "b" any more
    assert not _beat(lv, 1, 1300, "c1", lease_ms=1000)
