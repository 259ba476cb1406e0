"""Upstream RocketMQ's camelCase configuration names, taken beside ours wherever controller
and broker keys are (docs/configuration.md, "Upstream names"); an unknown name is still refused,
naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.broker.config import BrokerConfig, load_broker_toml
from dledger.config import ConfigError
from dledger.controller.config import ControllerConfig, load_controller_toml, member_config

BROKER = {"cluster": "c", "name": "b0", "controller": "127.0.0.1:1", "listen": "127.0.0.1:2",
          "ha_listen": "127.0.0.1:3", "store_dir": "/tmp/x"}


def test_a_broker_takes_upstream_names() -> None:
    cfg = BrokerConfig.from_dict({"brokerClusterName": "c", "brokerName": "b0", "controllerAddr": "127.0.0.1:1",
                                  "listen": "127.0.0.1:2", "ha_listen": "127.0.0.1:3", "storePathRootDir": "/tmp/x",
                                  "inSyncReplicas": 2, "minInSyncReplicas": 2, "allAckInSyncStateSet": True,
                                  "brokerElectionPriority": 3, "haMaxTimeSlaveNotCatchup": 7000,
                                  "flushDiskType": "SYNC_FLUSH", "mappedFileSizeCommitLog": 2 << 20})
    assert (cfg.cluster, cfg.name, cfg.controller, cfg.store_dir) == ("c", "b0", "127.0.0.1:1", "/tmp/x")
    assert (cfg.in_sync_replicas, cfg.min_in_sync_replicas, cfg.all_ack_in_sync_state_set) == (2, 2, True)
    assert (cfg.election_priority, cfg.ha_max_time_slave_not_catchup_ms) == (3, 7000)
    assert (cfg.flush, cfg.data_file_size) == ("sync", 2 << 20)


def test_a_broker_refuses_unknown_and_doubled_names(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown broker configuration keys: brokerNmae"):
        BrokerConfig.from_dict({**BROKER, "brokerNmae": "b1"})
    with pytest.raises(ConfigError, match=r"name is given twice \(as name and brokerName\)"):
        BrokerConfig.from_dict({**BROKER, "brokerName": "b1"})
    toml = tmp_path / "b.toml"
    toml.write_text('[broker]\nbrokerName = "b9"\nflushDiskType = "ASYNC_FLUSH"\n')
    data = load_broker_toml(toml)
    cfg = BrokerConfig.from_dict({**{k: v for k, v in BROKER.items() if k != "name"}, **data})
    assert (cfg.name, cfg.flush) == ("b9", "async")


def test_the_controller_takes_upstream_names_in_its_file_and_updates() -> None:
    cfg = ControllerConfig.from_dict({"scanNotActiveBrokerInterval": 400, "enableElectUncleanMaster": True,
                                      "notifyBrokerRoleChanged": False, "electMasterMaxRetryCount": 5})
    assert (cfg.scan_interval_ms, cfg.enable_elect_unclean_master, cfg.notify_broker_role_changed,
            cfg.elect_master_max_retry_count) == (400, True, False, 5)
    changed = ControllerConfig().updated("scanNotActiveBrokerInterval=600\nelectMasterMaxRetryCount = 2\n")
    assert (changed.scan_interval_ms, changed.elect_master_max_retry_count) == (600, 2)
    assert "scan_interval_ms=600" in changed.properties()  # shown under our names
    with pytest.raises(ConfigError, match="'scanNotActiveBrokerIntervall'"):
        ControllerConfig().updated("scanNotActiveBrokerIntervall=600")
    with pytest.raises(ConfigError, match="unknown controller configuration keys: controllerType"):
        ControllerConfig.from_dict({"controllerType": "jRaft"})
    for key in ("enableElectUncleanMaster", "configBlackList", "configStorePath"):
        with pytest.raises(PermissionError, match=key):
            ControllerConfig().updated(f"{key}=x")
    with pytest.raises(ConfigError, match="must be a positive integer"):  # nothing half-applied
        ControllerConfig().updated("scanNotActiveBrokerInterval=600\nelectMasterMaxRetryCount=0")


def test_a_controllers_member_keys_take_upstream_names(tmp_path: Path) -> None:
    """Upstream's properties file is flat: its controller names at the top level go to the
    [controller] table, its DLedger names to the member's keys."""
    toml = tmp_path / "c.toml"
    toml.write_text('controllerDLegerGroup = "ctl"\ncontrollerDLegerPeers = "n0-127.0.0.1:9001"\n'
                    'controllerDLegerSelfId = "n0"\ncontrollerStorePath = "%s"\nenableElectUncleanMaster = true\n'
                    '[controller]\nscanNotActiveBrokerInterval = 700\n' % (tmp_path / "store"))
    data, ccfg = load_controller_toml(toml)
    assert (ccfg.enable_elect_unclean_master, ccfg.scan_interval_ms) == (True, 700)
    member = member_config(data)
    assert (member.group, member.self_id, member.store_dir) == ("ctl", "n0", str(tmp_path / "store"))
    with pytest.raises(ConfigError, match="self_id is given twice"):
        member_config({**data, "controllerDLegerSelfId": "n1"})
