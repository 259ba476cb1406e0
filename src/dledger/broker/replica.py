"""A broker replica's role, lease and confirm offset (upstream's ReplicasManager), sans-I/O.

Its owner, broker.agent.BrokerAgent (which the runtime and the simulator both drive), tells
it what the controller said (`change_role`, `alter_answered`, `sync_state_set_read`,
`lease_granted`) and asks it what it may do (`send_refusal`, `acked`); it says which role
change happened so the agent can say what I/O it needs. Time is passed in.

Role changes happen only for a higher master epoch. A new master keeps its log (its valid
unconfirmed tail becomes part of the new epoch, as upstream and Raft leaders do) and starts
its epoch at the log's end. A master acknowledges only while its lease holds: from the send
time of a heartbeat the controller leader answered with a grant for this epoch, for
`lease_ms`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from enum import Enum

from dledger.broker.epoch_file import EpochFileCache
from dledger.broker.ha_master import HAConfig
from dledger.broker.ha_service import AckSettings, MasterHA
from dledger.broker.ha_slave import SlaveClient
from dledger.broker.log import BrokerLog
from dledger.codes import ControllerResponseCode as RC
from dledger.codes import DLedgerError, ResponseCode
from dledger.controller import messages as m
from dledger.store.base import AppendedBatch

log = logging.getLogger(__name__)


class BrokerRole(Enum):
    FENCED = "FENCED"
    MASTER = "MASTER"
    SLAVE = "SLAVE"


class Change(Enum):
    NONE = 0
    MASTER = 1  # became master: reset HA connections, heartbeat for the lease now
    SLAVE = 2  # became (another master's) slave: reset HA connections, connect to the master


class ReplicaState:
    def __init__(self, name: str, log_: BrokerLog, epochs: EpochFileCache, ha: HAConfig, acks: AckSettings,
                 lease_ms: int, ack_durable: bool = False, confirm_offset: int = -1) -> None:
        self.name, self.log, self.epochs, self.ha_config, self.acks = name, log_, epochs, ha, acks
        self.lease_ms, self.ack_durable = lease_ms, ack_durable
        self.broker_id = -1  # until registered
        self.role = BrokerRole.FENCED
        self.master_epoch = 0
        self.master_id: int | None = None
        self.master_address: str | None = None
        self.sync_state_set: frozenset[int] = frozenset()
        self.sync_state_set_epoch = 0
        self.master_ha: MasterHA | None = None
        self.slave: SlaveClient | None = None
        self.lease_until_ms = 0
        self.truncated_at: int | None = None  # the last cut of an unconfirmed tail (a slave's handshake)
        # broker id -> the certificate name the controller bound to it (its answers carry them);
        # one dict, updated in place: a master's HA connections read it at every handshake
        self.principals: dict[int, str] = {}
        self._resend: m.AlterSyncStateSet | None = None  # sent, no answer: send it again
        self.unresolved = False  # refused: read the controller's set before the next proposal
        self._confirm = max(min(confirm_offset, log_.max_offset), -1)  # recovery may have cut the log
        self._seen_cuts = 0
        self._entry_version = 0  # the epoch file's version holding our master epoch's entry
        # a (re)started replica: epochs that begin past what recovery kept wrote nothing it has
        epochs.truncate_suffix_by_offset(log_.max_offset + 1)
        self.forget_deleted_epochs()  # (retention may have deleted files just before a crash)

    # --- what the controller says ----------------------------------------------------------

    def change_role(self, master_id: int, master_address: str, master_epoch: int, sss_epoch: int,
                    sss: set[int] | frozenset[int], my_address: str) -> Change:
        """changeBrokerRole: only a higher master epoch changes the role (the same epoch may
        bring a newer SyncStateSet to a master)."""
        if master_epoch <= self.master_epoch:
            if master_epoch == self.master_epoch and self.role == BrokerRole.MASTER:
                self.sync_state_set_read(master_epoch, sss, sss_epoch)
            return Change.NONE
        if self.slave is not None and self.slave.cut_wanted is not None:
            # the runtime is cutting our log off its event loop: the log's end is not known
            # until it has (a new epoch begins there); the role is taken at the next answer
            # (the periodic replica-info read asks again)
            log.info("broker %s: a truncation of the log is in progress: master epoch %d taken at the next "
                     "answer", self.name, master_epoch)
            return Change.NONE
        if master_id == self.broker_id and master_epoch <= self.epochs.last_epoch:
            # we wrote in that epoch before a restart (and may have lost its unflushed tail,
            # which a slave may hold): a master only ever writes in a fresh epoch, which
            # registering again gets from the controller (MasterRestartedEvent)
            log.warning("broker %s: not continuing epoch %d as master after a restart: registering again",
                        self.name, master_epoch)
            return Change.NONE
        if master_epoch < self.epochs.last_epoch:
            log.error("broker %s: refusing master epoch %d below our last epoch %d (controller data lost? see "
                      "docs/controller.md)", self.name, master_epoch, self.epochs.last_epoch)
            return Change.NONE
        if master_id == self.broker_id:
            # the epoch begins at the log's end: its records durable first, then the entry.
            # Written here (a write error leaves the replica as it was), or, with deferred
            # epoch writes (the runtime), by the runtime off its event loop, which fsyncs the
            # log first; until the entry is on disk `send_refusal` refuses every send, so no
            # record of the epoch is written, let alone acknowledged, before it is durable
            if not self.epochs.deferred:
                self.log.store.flush()
            self.epochs.append_entry(master_epoch, self.log.max_offset)
            self._entry_version = self.epochs.version
        confirm = self.confirm_offset
        self._stop_slave()
        self.master_epoch, self.master_id, self.master_address = master_epoch, master_id, master_address
        self.lease_until_ms = 0  # a lease is for one epoch
        # an alter in doubt was the old mastership's: its epoch is fenced now, and the new
        # master's tracker starts from the controller's set
        self._resend, self.unresolved = None, False
        if master_id == self.broker_id:
            self.master_address = my_address
            self.sync_state_set, self.sync_state_set_epoch = frozenset(sss), sss_epoch
            self.master_ha = MasterHA(self.broker_id, self.log, self.epochs, self.ha_config, sss, confirm,
                                      durable_only=self.ack_durable, bindings=self.principals)
            self.role = BrokerRole.MASTER
            log.warning("broker %s id %d: MASTER at epoch %d (log ends at %d, confirmed %d)", self.name,
                        self.broker_id, master_epoch, self.log.max_offset, self.master_ha.confirm_offset)
            return Change.MASTER
        was_master = self.master_ha is not None
        self.master_ha = None
        self.slave = SlaveClient(self.broker_id, self.log, self.epochs, self.ha_config, self.ack_durable, master_epoch)
        self.slave.confirm_offset = confirm
        self._seen_cuts = 0
        self.role = BrokerRole.SLAVE
        log.warning("broker %s id %d: SLAVE of %d at epoch %d%s", self.name, self.broker_id, master_id, master_epoch,
                    " (was master)" if was_master else "")
        return Change.SLAVE

    def principals_read(self, principals: dict[int, str] | None) -> None:
        """The set's bindings, as a controller answer carried them (None: it carried none)."""
        if principals is not None and principals != self.principals:
            self.principals.clear()
            self.principals.update(principals)

    def _stop_slave(self) -> None:
        """(The caller read `confirm_offset` first, which took in the slave's.)"""
        self.sync_slave_truncation()
        self.slave = None

    # --- SyncStateSet changes, one at a time ----------------------------------

    def next_alter(self) -> m.AlterSyncStateSet | None:
        """The alter-sync-state-set request to send now, or None. An unanswered one is sent
        again as it was (if it was applied, the copy is refused as fenced and the read that
        follows tells); no new one goes out while one is unresolved."""
        ha = self.master_ha
        if ha is None:
            return None
        if self._resend is not None:
            req, self._resend = self._resend, None
            return req
        if self.unresolved:
            return None
        proposal = ha.tracker.take_proposal()
        if proposal is None:
            return None
        return m.AlterSyncStateSet(self.name, self.broker_id, self.master_epoch, sorted(proposal),
                                   self.sync_state_set_epoch)

    def alter_answered(self, req: m.AlterSyncStateSet, resp: m.Response | None) -> None:
        """The answer to `req` (None: none came). After a refusal `unresolved` is set: the
        runtime reads the controller's set (`sync_state_set_read`)."""
        if self.master_ha is None or req.master_epoch != self.master_epoch:
            return  # an old mastership's: its tracker is gone
        if resp is None:
            self._resend = req
        elif resp.code == RC.SUCCESS and resp.new_sync_state_set_epoch is not None:
            self.sync_state_set_read(req.master_epoch, set(resp.sync_state_set or req.sync_state_set),
                                     resp.new_sync_state_set_epoch)
        else:
            log.info("broker %s: SyncStateSet %s refused (%s): reading the controller's", self.name,
                     req.sync_state_set, resp.remark or resp.code)
            self.unresolved = True

    def sync_state_set_read(self, master_epoch: int, sss: set[int] | frozenset[int], epoch: int) -> None:
        """The controller's set at `master_epoch`: an alter's success, or read (replica info)
        after a refusal or by the periodic metadata sync (changeSyncStateSet)."""
        ha = self.master_ha
        if ha is None or master_epoch != self.master_epoch:
            return
        if epoch > self.sync_state_set_epoch:
            self.sync_state_set, self.sync_state_set_epoch = frozenset(sss), epoch
            ha.sync_state_set_read(sss, newer=True)
            self._resend = None
        elif self.unresolved and self._resend is None:
            ha.sync_state_set_read(sss, newer=False)  # the refused proposal was not applied
        self.unresolved = False

    def lease_granted(self, sent_ms: int, epoch: int) -> None:
        """The controller leader granted the lease asked for by a heartbeat sent at `sent_ms`
        while we were master at `epoch`."""
        if self.role == BrokerRole.MASTER and epoch == self.master_epoch:
            self.lease_until_ms = max(self.lease_until_ms, sent_ms + self.lease_ms)

    def lease_valid(self, now_ms: int) -> bool:
        return self.role == BrokerRole.MASTER and now_ms < self.lease_until_ms

    @property
    def heartbeat_lease_ms(self) -> int:
        return self.lease_ms if self.role == BrokerRole.MASTER else 0

    # --- the confirm offset ----------------------------------------------------------------

    @property
    def confirm_offset(self) -> int:
        """What readers may see; it never goes back while the log keeps it."""
        if self.master_ha is not None:
            self._confirm = max(self._confirm, self.master_ha.confirm_offset)
        elif self.slave is not None:
            if self.slave.cuts != self._seen_cuts:  # bytes we held were cut: so was what we confirmed
                self._seen_cuts = self.slave.cuts
                self._confirm = min(self._confirm, self.log.max_offset)
            self._confirm = max(self._confirm, min(self.slave.confirm_offset, self.log.max_offset))
        return min(self._confirm, self.log.max_offset)

    # --- retention -----------------------------------------------------------------------------

    def retention_floor(self, now_ms: int, hold_ms: int) -> int:
        """The lowest offset a replica may still need: retention deletes only the files wholly
        below it. A master: its confirm offset (the least ack of the SyncStateSet, connected or
        not), every connected slave's ack (one that has not acked yet holds the whole log) and
        the last ack of every slave heard from within `hold_ms` (one restarting finds its next
        record; one silent for longer holds nothing back, and if it comes back needing deleted
        records it is refused, docs/brokers.md); a slave or a fenced replica: its own confirm
        offset (what it has not confirmed may yet be cut, or be needed by the other slaves if
        it becomes master)."""
        floor = self.confirm_offset
        ha = self.master_ha
        if ha is not None:
            for c in ha.connections.values():
                floor = min(floor, c.ack_offset if c.ack_offset >= 0 else self.log.min_offset)
            for ack, at in ha.heard.values():
                if now_ms - at <= hold_ms:
                    floor = min(floor, ack)
        return max(floor, self.log.min_offset)

    def forget_deleted_epochs(self) -> None:
        """Retention moved the log's min offset: the epochs that ended at or before it go from
        the epoch file (upstream's EpochFileCache.truncatePrefixByOffset)."""
        first = self.epochs.entries[0] if self.epochs.entries else None
        if first is not None and first.end <= self.log.min_offset:
            self.epochs.truncate_prefix_by_offset(self.log.min_offset)

    def sync_slave_truncation(self) -> None:
        if self.slave is not None and self.slave.truncated_at is not None:
            self.truncated_at = self.slave.truncated_at

    # --- sends -----------------------------------------------------------------------------

    def send_refusal(self, now_ms: int) -> DLedgerError | None:
        """Why a send is refused before anything is written, or None."""
        if self.master_ha is None:
            hint = f"; the master is {self.master_id} at {self.master_address}" if self.master_address else ""
            return DLedgerError(ResponseCode.SERVICE_NOT_AVAILABLE,
                                f"broker {self.name} id {self.broker_id} is {self.role.value}{hint}")
        if self.epochs.written < self._entry_version:
            return DLedgerError(ResponseCode.SERVICE_NOT_AVAILABLE,
                                f"broker {self.name}: master epoch {self.master_epoch} is being made durable "
                                "(the log's fsync and the epoch file): not accepting sends yet")
        if not self.lease_valid(now_ms):
            return DLedgerError(ResponseCode.SERVICE_NOT_AVAILABLE,
                                f"broker {self.name}: the master's lease has expired (the controller leader is not "
                                "reachable): not accepting sends")
        reason = self.master_ha.refuse_reason(self.acks)
        if reason is not None:
            return DLedgerError(ResponseCode.IN_SYNC_REPLICAS_NOT_ENOUGH, reason)
        return None

    def append(self, bodies: Sequence[bytes]) -> AppendedBatch:
        """Write as master (after `send_refusal` said None); the confirm offset follows."""
        result = self.log.append(bodies, self.master_epoch)
        if self.master_ha is not None:
            self.master_ha.recompute_confirm()
        return result

    def acked(self, next_offset: int) -> bool:
        return self.master_ha is not None and self.master_ha.acked(next_offset, self.acks.need)


# The name this had before issue 27's one vocabulary, kept so scripts written against it still run.
Role = BrokerRole
