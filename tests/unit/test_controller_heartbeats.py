"""Broker liveness on one controller (CONTROLLER.md §1.5) and the controller's own settings,
without a network: time is passed in."""

from __future__ import annotations

import pytest

from dledger.config import ConfigError
from dledger.controller.config import ControllerConfig
from dledger.controller.elect_policy import LiveInfo
from dledger.controller.heartbeats import MAX_PER_SET, HeartbeatTable


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


def test_a_closed_connection_evicts_only_the_brokers_that_last_beat_on_it() -> None:
    """#11045: upstream never rebound the channel, so a stale channel's close evicted a broker
    that had reconnected, and triggered an election."""
    t = HeartbeatTable(1500)
    old, new = object(), object()
    t.beat("c", "b", 1, "h", 0, conn=old)
    t.beat("c", "b", 2, "h", 0, conn=old)
    t.beat("c", "b", 1, "h", 5, conn=new)  # broker 1 reconnected
    assert t.connection_closed(old) == [("b", 2)]
    assert t.alive("b", 1, 10) and not t.alive("b", 2, 10)
    assert t.connection_closed(new) == [("b", 1)]


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
    c = ControllerConfig().updated("# tuned\nscan_interval_ms = 100\nenable_elect_unclean_master=true\n")
    assert (c.scan_interval_ms, c.enable_elect_unclean_master) == (100, True)
    assert ControllerConfig().updated(c.properties()) == c
    with pytest.raises(PermissionError):
        c.updated("config_store_path=/tmp")
    for bad in ("nope=1", "scan_interval_ms", "scan_interval_ms=x", "notify_broker_role_changed=maybe",
                "scan_interval_ms=-5"):
        with pytest.raises(ConfigError):
            c.updated(bad)
