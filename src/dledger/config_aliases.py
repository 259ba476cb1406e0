"""Upstream RocketMQ's camelCase configuration names, taken beside ours (docs/configuration.md,
"Upstream names"): a properties file or an mqadmin habit carries over. One place resolves
them, for the controller's and the broker's keys alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dledger.config import ConfigError


def resolve(data: Mapping[str, Any], aliases: Mapping[str, str], what: str) -> dict[str, Any]:
    """`data` with every upstream name replaced by ours; a key given under both names is an
    error naming both (which one wins would be a guess). Unknown names pass through: the
    caller refuses them, naming them."""
    out: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for key, value in data.items():
        ours = aliases.get(key, key) if isinstance(key, str) else key
        if ours in out:
            raise ConfigError(f"{what} key {ours} is given twice (as {given_as[ours]} and {key})")
        out[ours], given_as[ours] = value, key
    return out


# DLedgerConfig's names (upstream DLedger's) for a group member's keys (its TOML's)
MEMBER_ALIASES: dict[str, str] = {
    "selfId": "self_id",
    "fileReservedHours": "file_reserved_hours",
    "diskSpaceRatioToCheckExpired": "disk_space_ratio_to_check_expired",
    "diskSpaceRatioToForceClean": "disk_space_ratio_to_force_clean",
    "mappedFileSizeForEntryData": "data_file_size",
    "mappedFileSizeForEntryIndex": "index_file_size",
    "preferredLeaderIds": "preferred_leader_ids",
    "heartBeatTimeIntervalMs": "heart_beat_time_interval_ms",
    "maxHeartBeatLeak": "max_heart_beat_leak",
    "minVoteIntervalMs": "min_vote_interval_ms",
    "maxVoteIntervalMs": "max_vote_interval_ms",
    "maxPendingRequestsNum": "max_pending_requests",
    "maxWaitAckTimeMs": "max_wait_ack_ms",
    "maxPushTimeOutMs": "max_push_timeout_ms",
    "checkPointInterval": "checkpoint_interval_ms",
    "flushFileInterval": "flush_interval_ms",
}

# ControllerConfig's names (upstream's ControllerConfig): the runtime settings
CONTROLLER_ALIASES: dict[str, str] = {
    "scanNotActiveBrokerInterval": "scan_interval_ms",
    "scanInactiveMasterInterval": "scan_interval_ms",  # one scan here finds dead brokers and masters
    "enableElectUncleanMaster": "enable_elect_unclean_master",
    "notifyBrokerRoleChanged": "notify_broker_role_changed",
    "electMasterMaxRetryCount": "elect_master_max_retry_count",
    # never updatable (upstream's configBlackList): named so the refusal names ours
    "configBlackList": "config_black_list",
    "configStorePath": "config_store_path",
    "rocketmqHome": "rocketmq_home",
}

# ControllerConfig's names for what a controller's Raft member is configured with (its TOML's
# top-level keys)
CONTROLLER_MEMBER_ALIASES: dict[str, str] = {
    "controllerDLegerGroup": "group",
    "controllerDLegerPeers": "peers",
    "controllerDLegerSelfId": "self_id",
    "controllerStorePath": "store_dir",
    "mappedFileSize": "data_file_size",
}

# BrokerConfig's and MessageStoreConfig's names
BROKER_ALIASES: dict[str, str] = {
    "brokerClusterName": "cluster",
    "brokerName": "name",
    "controllerAddr": "controller",
    "storePathRootDir": "store_dir",
    "inSyncReplicas": "in_sync_replicas",
    "minInSyncReplicas": "min_in_sync_replicas",
    "allAckInSyncStateSet": "all_ack_in_sync_state_set",
    "brokerElectionPriority": "election_priority",
    "brokerHeartbeatInterval": "heartbeat_interval_ms",
    "syncBrokerMetadataPeriod": "sync_metadata_ms",
    "checkSyncStateSetPeriod": "check_sync_state_set_ms",
    "haSendHeartbeatInterval": "ha_heartbeat_ms",
    "haHousekeepingInterval": "ha_housekeeping_ms",
    "haMaxTimeSlaveNotCatchup": "ha_max_time_slave_not_catchup_ms",
    "haTransferBatchSize": "ha_transfer_batch_bytes",
    "flushDiskType": "flush",  # its values ASYNC_FLUSH / SYNC_FLUSH are taken too
    "mappedFileSizeCommitLog": "data_file_size",
}

FLUSH_DISK_TYPES = {"ASYNC_FLUSH": "async", "SYNC_FLUSH": "sync"}
