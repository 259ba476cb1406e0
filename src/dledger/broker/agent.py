"""A broker's decisions, sans-I/O (docs/brokers.md): registration, roles, the SyncStateSet
alter loop, the lease heartbeat and waiting for a send's acks.

`BrokerAgent` owns the replica (`ReplicaState`) and decides; a driver does the I/O. The
runtime (`broker.server.BrokerServer`, asyncio and sockets) and the simulator
(`sim.brokers`, simulated time and connections) drive the same agent, as `GroupRuntime` and
`SimCluster` drive the same `Node`. Inputs are method calls with the time passed in (`tick`,
the answers to the agent's own requests, HA progress, sends); each returns a list of effects,
small frozen values the driver carries out in order. The agent never reads a clock and never
waits: a request it makes carries a token, and its answer (or None: no answer in time) comes
back with that token; an answer to a token the agent no longer waits for is ignored.

The rules (upstream ReplicasManager, AutoSwitchHAService):
- Startup: fenced until registered (REGISTER_BROKER, with the persistent id the driver's
  `Registration` keeps); then a heartbeat, so the controller counts us alive; then the master
  the registration named, or an election we ask for. Retried every `startup_retry_ms`.
- Then the controller leader's replica info every `sync_metadata_ms`, and at once after a
  hint (a NOTIFY_BROKER_ROLE_CHANGED, or an HA handshake from an unknown slave); one query in
  flight however many hints arrive. Nothing a NOTIFY says is used: roles come only from the
  controller's own answers, so no epoch the controller does not hold is acted on. An answer
  saying our set is unknown (CONTROLLER_BROKER_METADATA_NOT_EXIST) makes us register again.
- Role changes only for a higher master epoch (ReplicaState.change_role); any change closes
  every HA connection (#9689) and fails the sends still waiting; a new master heartbeats at
  once for its lease, a new slave connects to its master.
- SyncStateSet changes go to the controller one at a time; a refused one is resolved by
  reading the controller's set, an unanswered (or unauthenticated) one is sent again, each
  after `alter_retry_ms`.
- A heartbeat every `heartbeat_interval_ms` after the previous one's answers; a master asks
  for its lease in it and holds it from the heartbeat's send time. It reports the highest
  master epoch this process heard from the controller (`heard_epoch`, -1 after a start):
  after a master restarts, the controller ranks only reports made at or past the epoch the
  restart made.
- Every request the agent makes gets its answer (or None) from the driver; as a backstop, one
  outstanding for `REQUEST_DEADLINE_MS` counts as unanswered, and an input that raises still
  leaves the chain, the alter loop and the heartbeats going (they retry, as above).
- Sends: refused before the write without mastership, lease or min-in-sync replicas;
  after it, durable first (flush=sync), then acknowledged by enough of the SyncStateSet
  (`acks`) within `slave_timeout_ms`, and answered only if the mastership and its lease held
  until then (else FLUSH_SLAVE_TIMEOUT: written, not acknowledged).
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

from dledger.broker import messages as bm
from dledger.broker.config import BrokerConfig, split_address
from dledger.broker.epoch_file import EpochFileCache
from dledger.broker.ha_master import HAConfig
from dledger.broker.ha_service import AckSettings, MasterHA
from dledger.broker.ha_slave import SlaveClient
from dledger.broker.log import BrokerLog
from dledger.broker.replica import BrokerRole, Change, ReplicaState
from dledger.codes import ControllerResponseCode as RC
from dledger.codes import DLedgerError, ResponseCode
from dledger.controller import messages as m
from dledger.controller.elect_policy import PRIORITY_DEFAULT
from dledger.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

STARTUP_RETRY_MS = 500  # upstream: 5 s
ALTER_RETRY_MS = 500
SAVE_CONFIRM_MS = 1000
# A backstop far beyond any request's own timeout (a registration pass is at most three
# controller calls of a few seconds): a driver that lost an answer must not stop the agent.
REQUEST_DEADLINE_MS = 60_000


@dataclass(frozen=True)
class AgentSettings:
    cluster: str
    name: str
    address: str  # advertised, `host:port|host:haport`
    election_priority: int = PRIORITY_DEFAULT
    heartbeat_interval_ms: int = 300
    sync_metadata_ms: int = 1000
    check_sync_state_set_ms: int = 1000
    slave_timeout_ms: int = 3000
    wait_durable: bool = False  # flush=sync: a send is acknowledged only once fsynced
    startup_retry_ms: int = STARTUP_RETRY_MS
    alter_retry_ms: int = ALTER_RETRY_MS
    save_confirm_ms: int = SAVE_CONFIRM_MS
    retention_hold_ms: int = 600_000  # a master's retention keeps what a slave heard from this recently needs

    @classmethod
    def from_config(cls, config: BrokerConfig) -> AgentSettings:
        return cls(config.cluster, config.name, config.address, config.election_priority,
                   config.heartbeat_interval_ms, config.sync_metadata_ms, config.check_sync_state_set_ms,
                   config.slave_timeout_ms, config.flush == "sync", retention_hold_ms=config.retention_hold_ms)


# --- effects: what the driver does -----------------------------------------------------------

@dataclass(frozen=True)
class Register:
    """Run one registration pass (identity files, id application, REGISTER_BROKER); answer with
    `register_answered(token, ...)`."""

    token: int


@dataclass(frozen=True)
class CallController:
    """Send `request` to the controller leader; answer with `answered(token, ...)` (None: no
    answer in time)."""

    token: int
    request: m.Request


@dataclass(frozen=True)
class SendHeartbeat:
    """Send `request` to every controller; answer with `heartbeat_answered(token, ...)` with the
    answers that came in time."""

    token: int
    request: m.BrokerHeartbeat


@dataclass(frozen=True)
class ResetHA:
    """Close every HA connection: the master's to its slaves and the slave's to its master."""


@dataclass(frozen=True)
class FollowMaster:
    """Connect `client` to the master's HA port (`ha_address`; empty: the master advertised none)."""

    master_id: int
    ha_address: str
    client: SlaveClient


@dataclass(frozen=True)
class WakeHA:
    """The log grew: the master's HA writers look again."""


@dataclass(frozen=True)
class ConfirmMoved:
    """The confirm offset moved: HA writers and waiting readers look again."""


@dataclass(frozen=True)
class AwaitDurable:
    """A send waits for entry `index` to be fsynced: call `durable(...)` once it is."""

    index: int


@dataclass(frozen=True)
class SendDone:
    """The answer to send `send_id`: its result, or why it was refused or not acknowledged."""

    send_id: int
    result: bm.SendResponse | DLedgerError


@dataclass(frozen=True)
class SaveConfirm:
    """Time to persist the confirm offset (the driver writes it when it changed)."""

    offset: int


Effect = (Register | CallController | SendHeartbeat | ResetHA | FollowMaster | WakeHA | ConfirmMoved | AwaitDurable
          | SendDone | SaveConfirm)


# --- what the agent waits for ----------------------------------------------------------------

class _Step(Enum):
    """The controller chain's request in flight (one at a time: startup, then following)."""

    REGISTER = 1
    STARTUP_HEARTBEAT = 2
    STARTUP_ELECT = 3
    QUERY = 4  # replica info (the poll, or a hint)
    REREGISTER = 5  # the controller did not know our set
    ELECT = 6  # a higher epoch without a master


@dataclass
class _Send:
    send_id: int
    epoch: int
    ha: MasterHA
    first_index: int
    positions: list[int]
    next_offset: int  # the log's end after the write: acknowledged once this much is on the copies
    durable_index: int  # with wait_durable: the entry that must be fsynced first
    deadline_ms: int = 0


class BrokerAgent:
    def __init__(self, settings: AgentSettings, log_: BrokerLog, epochs: EpochFileCache, ha: HAConfig,
                 acks: AckSettings, lease_ms: int, *, now_ms: int, broker_id: int = -1,
                 confirm_offset: int = -1) -> None:
        """`broker_id`: the persistent id already held (the identity file), -1 before the first
        registration; it heartbeats from the start when it has one. flush=sync
        (`settings.wait_durable`) also makes the replica count only durable copies (a slave acks
        what it fsynced, a master's own copy counts once fsynced)."""
        self.settings = settings
        self.log = log_
        self.epochs = epochs
        self.replica = ReplicaState(settings.name, log_, epochs, ha, acks, lease_ms,
                                    ack_durable=settings.wait_durable,
                                    confirm_offset=confirm_offset)
        self.broker_id = broker_id
        self.replica_info_queries = 0  # GET_REPLICA_INFO asked by the poll and hints (runtime info)
        # the highest master epoch the controller has told this process (its heartbeats report
        # it: after a master restart only reports made at or past the new epoch rank replicas)
        self.heard_epoch = -1
        self._tokens = itertools.count(1)
        self._warn = RateLimitedLog(log).warning
        # the controller chain: startup until a role is taken, then following the controller
        self._following = False
        self._step: tuple[int, _Step] | None = None
        self._step_at = now_ms  # when the step in flight was asked (the deadline backstop)
        self._chain_at = now_ms
        self._hinted = False
        self._registered: m.Response | None = None
        # heartbeats: token -> (send time, master epoch then); the periodic one's token
        self._beats: dict[int, tuple[int, int]] = {}
        self._beat_token: int | None = None
        self._beat_at = now_ms
        # the alter loop: the request in flight (alter, or the replica-info read after a refusal)
        self._altering = False
        self._alter_call: tuple[int, m.AlterSyncStateSet | None] | None = None
        self._alter_at = now_ms
        self._alter_paused_until: int | None = None
        # housekeeping
        self._checked_at = self._saved_at = now_ms
        # sends after their write: waiting for their fsync, then for their acks
        self._durable_wait: deque[_Send] = deque()
        self._ack_wait: deque[_Send] = deque()

    @property
    def role(self) -> BrokerRole:
        return self.replica.role

    def _token(self) -> int:
        return next(self._tokens)

    # --- time ----------------------------------------------------------------------------------

    def tick(self, now: int) -> list[Effect]:
        """Timers: startup retries, the replica-info poll, heartbeats, the alter loop's pause,
        send deadlines, the SyncStateSet shrink check, saving the confirm offset and the
        retention floor."""
        with self._settled(now):
            out = self._overdue(now)
            if self._step is None and (now >= self._chain_at or (self._following and self._hinted)):
                out += self._chain_next(now)
            if self._beat_token is None and now >= self._beat_at:
                if self.broker_id != -1:
                    self._beat_token = self._token()
                    out.append(self._heartbeat(self._beat_token, now))
                else:
                    self._beat_at = now + self.settings.heartbeat_interval_ms
            # (each timer below may read the store: one that fails leaves the others running)
            if self._alter_paused_until is not None and now >= self._alter_paused_until:
                self._alter_paused_until = None
                out += self._safely("resuming the alter loop", self._alter_resume, now)
            out += self._safely("expiring sends", self._expire, now)
            ha = self.replica.master_ha
            if ha is not None and now - self._checked_at >= self.settings.check_sync_state_set_ms:
                self._checked_at = now
                if ha.shrink(now) is not None:
                    out += self._safely("proposing a SyncStateSet", self._propose, now)
            if now - self._saved_at >= self.settings.save_confirm_ms:
                self._saved_at = now
                out += self._safely("reading the confirm offset", lambda t: [SaveConfirm(self.replica.confirm_offset)],
                                    now)
                out += self._safely("retention", self._retention, now)
            return out

    def _retention(self, now: int) -> list[Effect]:
        """Tell the store what the replicas still need (its retention deletes only files wholly
        below), and forget the epochs whose records retention deleted."""
        r = self.replica
        r.forget_deleted_epochs()
        self.log.retain_from(r.retention_floor(now, self.settings.retention_hold_ms))
        return []

    def _safely(self, what: str, step: Callable[[int], list[Effect]], now: int) -> list[Effect]:
        """A timer's step; a store or disk error is logged and the step tried again next time."""
        try:
            return step(now)
        except (OSError, DLedgerError) as e:
            self._warn(what, "broker %s: %s failed: %s", self.settings.name, what, e)
            return []

    @contextmanager
    def _settled(self, now: int, token: int | None = None) -> Iterator[None]:
        """What holds however an input ends, raising included (a store error in a role
        change, say; the driver logs it): the chain step `token` answered is over, so the
        chain goes on at its next time; a running alter loop has a request in flight or a
        pause, so it goes on after the pause. (On a normal return both hold already.)"""
        try:
            yield
        finally:
            if token is not None and self._step is not None and self._step[0] == token:
                self._step = None
                self._chain_at = now + (self.settings.sync_metadata_ms if self._following
                                        else self.settings.startup_retry_ms)
            if self._altering and self._alter_call is None and self._alter_paused_until is None:
                self._alter_paused_until = now + self.settings.alter_retry_ms

    def _overdue(self, now: int) -> list[Effect]:
        """The backstop: a request still unanswered after REQUEST_DEADLINE_MS counts as
        answered with None (a driver that lost an answer would otherwise stop the chain, the
        alter loop or the heartbeats for good)."""
        out: list[Effect] = []
        late = now - REQUEST_DEADLINE_MS
        if self._step is not None and self._step_at <= late:
            token, step = self._step
            log.warning("broker %s: no answer to %s in %d ms: going on without it", self.settings.name,
                        step.name, REQUEST_DEADLINE_MS)
            if step in (_Step.REGISTER, _Step.REREGISTER):
                out += self.register_answered(token, now, self.broker_id, None)
            elif step == _Step.STARTUP_HEARTBEAT:
                out += self.heartbeat_answered(token, now, [])
            else:
                out += self.answered(token, now, None)
        if self._alter_call is not None and self._alter_at <= late:
            out += self.answered(self._alter_call[0], now, None)
        for token in [t for t, (sent, _) in self._beats.items() if sent <= late]:
            out += self.heartbeat_answered(token, now, [])
        return out

    def next_tick_at(self) -> int:
        """When `tick` has something to do next (at the latest)."""
        times = [self._saved_at + self.settings.save_confirm_ms]
        if self._step is None:
            times.append(self._chain_at)
        else:
            times.append(self._step_at + REQUEST_DEADLINE_MS)
        if self._alter_call is not None:
            times.append(self._alter_at + REQUEST_DEADLINE_MS)
        if self._beats:
            times.append(min(sent for sent, _ in self._beats.values()) + REQUEST_DEADLINE_MS)
        if self._beat_token is None:
            times.append(self._beat_at)
        if self._alter_paused_until is not None:
            times.append(self._alter_paused_until)
        if self._ack_wait:
            times.append(self._ack_wait[0].deadline_ms)
        if self.replica.master_ha is not None:
            times.append(self._checked_at + self.settings.check_sync_state_set_ms)
        return min(times)

    # --- the controller chain: registration, then following the controller ------------------

    def _chain_next(self, now: int) -> list[Effect]:
        if not self._following:
            return [Register(self._ask(_Step.REGISTER, now))]
        self._hinted = False
        self.replica_info_queries += 1
        return self._chain_call(_Step.QUERY, m.GetReplicaInfo(self.settings.name), now)

    def _ask(self, step: _Step, now: int) -> int:
        """The chain's next request: its token."""
        token = self._token()
        self._step, self._step_at = (token, step), now
        return token

    def _chain_call(self, step: _Step, req: m.Request, now: int) -> list[Effect]:
        return [CallController(self._ask(step, now), req)]

    def _elect_request(self) -> m.ElectMaster:
        return m.ElectMaster(self.settings.cluster, self.settings.name, self.broker_id)

    def _chain_done(self, now: int) -> list[Effect]:
        """The chain's request is answered: the next step in a while (at once after a hint)."""
        self._step = None
        if not self._following:
            self._chain_at = now + self.settings.startup_retry_ms
            return []
        self._chain_at = now + self.settings.sync_metadata_ms
        return self._chain_next(now) if self._hinted else []

    def _waiting(self, token: int, step: _Step) -> bool:
        return self._step == (token, step)

    def register_answered(self, token: int, now: int, broker_id: int, response: m.Response | None) -> list[Effect]:
        """A registration pass ended: `broker_id` is the id it holds now (-1: none yet),
        `response` the controller's REGISTER_BROKER answer if it registered (None: it did not)."""
        with self._settled(now, token):
            self.broker_id = broker_id
            self._heard(response)
            if response is not None:
                self._registered = response
            if self._waiting(token, _Step.REREGISTER):
                return self._chain_done(now)
            if not self._waiting(token, _Step.REGISTER):
                return []
            if response is None:
                return self._chain_done(now)
            log.info("broker %s registered as id %d", self.settings.name, broker_id)
            return [self._heartbeat(self._ask(_Step.STARTUP_HEARTBEAT, now), now)]

    def _startup_heartbeat_answered(self, now: int) -> list[Effect]:
        resp = self._registered
        if resp is None or resp.master_broker_id is None or resp.master_address is None:
            return self._chain_call(_Step.STARTUP_ELECT, self._elect_request(), now)
        return self._take_role(resp, now)

    def _take_role(self, resp: m.Response, now: int) -> list[Effect]:
        """The end of a startup attempt: take the role a controller answer names."""
        self._heard(resp)
        try:
            out = self._apply_replica_info(resp, now)
        except (OSError, DLedgerError) as e:  # the epoch file or the store failed: stay fenced, retry
            log.error("broker %s: taking a role failed: %s", self.settings.name, e)
            out = []
        if self.role != BrokerRole.FENCED:
            self._following = True
        return out + self._chain_done(now)

    def _apply_replica_info(self, resp: m.Response, now: int) -> list[Effect]:
        """Take the role a controller answer names (register, election or replica info: never
        a NOTIFY's fields)."""
        self.replica.principals_read(resp.principals)
        if resp.master_broker_id is None or resp.master_address is None or resp.master_epoch is None:
            return []
        return self._change_role(resp.master_broker_id, resp.master_address, resp.master_epoch,
                                 resp.sync_state_set_epoch or 0, set(resp.sync_state_set or ()), now)

    def _replica_info_answered(self, resp: m.Response | None, now: int) -> list[Effect]:
        """schedulingSyncBrokerMetadata: the controller's view of our set."""
        r = self.replica
        self._heard(resp)
        if resp is None:
            return self._chain_done(now)
        if resp.code == RC.CONTROLLER_BROKER_METADATA_NOT_EXIST:
            return [Register(self._ask(_Step.REREGISTER, now))]
        if resp.code != RC.SUCCESS or resp.master_epoch is None:
            return self._chain_done(now)
        r.principals_read(resp.principals)
        out: list[Effect] = []
        if resp.master_epoch > r.master_epoch:
            if resp.master_broker_id is None:
                return self._chain_call(_Step.ELECT, self._elect_request(), now)
            try:
                out = self._apply_replica_info(resp, now)
            except (OSError, DLedgerError) as e:  # as at startup: the next poll tries again
                log.error("broker %s: a role change failed: %s", self.settings.name, e)
        elif resp.master_epoch == r.master_epoch and self.role == BrokerRole.MASTER:
            r.sync_state_set_read(resp.master_epoch, set(resp.sync_state_set or ()), resp.sync_state_set_epoch or 0)
            try:
                out = self._after_confirm_change()
            except (OSError, DLedgerError) as e:
                log.error("broker %s: reading the confirm offset failed: %s", self.settings.name, e)
            out += self._propose(now)
        return out + self._chain_done(now)

    def hint(self, now: int) -> list[Effect]:
        """A NOTIFY_BROKER_ROLE_CHANGED (or an unknown slave's handshake): ask the controller
        leader for replica info now, or after the query in flight; before a role is taken,
        once following. The hint's own fields are never used (a forged one could name any
        master and epoch)."""
        self._hinted = True
        if self._following and self._step is None:
            return self._chain_next(now)
        return []

    # --- roles ---------------------------------------------------------------------------------

    def _change_role(self, master_id: int, master_address: str, master_epoch: int, sss_epoch: int,
                     sss: set[int], now: int) -> list[Effect]:
        """changeBrokerRole, and what the change needs done."""
        self.replica.broker_id = self.broker_id
        change = self.replica.change_role(master_id, master_address, master_epoch, sss_epoch, sss,
                                          self.settings.address)
        if change == Change.NONE:
            return self._after_confirm_change()
        out: list[Effect] = [ResetHA()]  # every epoch change re-handshakes every slave (#9689)
        out += self._fail_sends(ResponseCode.FLUSH_SLAVE_TIMEOUT, "the role changed before the send was "
                                "acknowledged (it may be kept or truncated)")
        if change == Change.MASTER:
            out.append(self._heartbeat(self._token(), now))  # the lease, now
            return out
        slave = self.replica.slave
        assert slave is not None
        out.append(FollowMaster(master_id, split_address(master_address)[1], slave))
        return out

    # --- heartbeats and the lease -------------------------------------------------------

    def _heartbeat(self, token: int, now: int) -> SendHeartbeat:
        r, s = self.replica, self.settings
        self._beats[token] = (now, r.master_epoch)
        return SendHeartbeat(token, m.BrokerHeartbeat(
            s.cluster, s.address, s.name, self.broker_id, self.epochs.last_epoch, self.log.max_offset,
            r.confirm_offset, election_priority=s.election_priority, lease_ms=r.heartbeat_lease_ms,
            master_epoch=self.heard_epoch))

    def _heard(self, resp: m.Response | None) -> None:
        """A controller answer's master epoch (with a master or without one) was heard."""
        if resp is not None and resp.code in (RC.SUCCESS, RC.CONTROLLER_MASTER_STILL_EXIST) \
                and resp.master_epoch is not None:
            self.heard_epoch = max(self.heard_epoch, resp.master_epoch)

    def heartbeat_answered(self, token: int, now: int, answers: Sequence[m.Response]) -> list[Effect]:
        """The answers a heartbeat got in time (the leader's may grant the lease asked for)."""
        sent = self._beats.pop(token, None)
        if sent is None:
            return []
        if token == self._beat_token:  # (first: the next heartbeat is due whatever follows)
            self._beat_token = None
            self._beat_at = now + self.settings.heartbeat_interval_ms
        with self._settled(now, token):
            r = self.replica
            if any(x.lease_granted for x in answers):
                r.lease_granted(*sent)
            elif r.heartbeat_lease_ms:
                remark = next((x.remark for x in answers if x.remark), "")
                if remark:
                    log.warning("broker %s: %s", self.settings.name, remark)
            if self._waiting(token, _Step.STARTUP_HEARTBEAT):
                return self._startup_heartbeat_answered(now)
            return []

    # --- controller answers ----------------------------------------------------------------------

    def answered(self, token: int, now: int, resp: m.Response | None) -> list[Effect]:
        """The answer to a CallController (None: none came in time)."""
        with self._settled(now, token):
            if self._alter_call is not None and self._alter_call[0] == token:
                req = self._alter_call[1]
                self._alter_call = None
                return self._alter_answered(req, resp, now) if req is not None else self._alter_read(resp, now)
            if self._step is None or self._step[0] != token:
                return []
            step = self._step[1]
            if step == _Step.QUERY:
                return self._replica_info_answered(resp, now)
            if step == _Step.STARTUP_ELECT:
                if resp is None:
                    return self._chain_done(now)
                if resp.code not in (RC.SUCCESS, RC.CONTROLLER_MASTER_STILL_EXIST):
                    log.info("broker %s: no master yet (%s)", self.settings.name, resp.remark or resp.code)
                    return self._chain_done(now)
                return self._take_role(resp, now)
            # ELECT: the election's outcome arrives as replica info (the next poll, or its NOTIFY)
            return self._chain_done(now)

    # --- SyncStateSet proposals -----------------------------------------------------

    def proposal(self, now: int) -> list[Effect]:
        """The master's HA service wants a SyncStateSet change (a slave caught up, or its
        connection closed): the alter loop sends it unless it runs."""
        with self._settled(now):
            return self._propose(now)

    def _propose(self, now: int) -> list[Effect]:
        if self._altering:
            return []
        self._altering = True
        return self._alter_next(now)

    def _alter_next(self, now: int) -> list[Effect]:
        req = self.replica.next_alter()
        if req is None:
            self._altering = False
            return []
        return [self._alter_ask(req, now)]

    def _alter_ask(self, req: m.Request, now: int) -> CallController:
        token = self._token()
        self._alter_call = (token, req if isinstance(req, m.AlterSyncStateSet) else None)
        self._alter_at = now
        return CallController(token, req)

    def _alter_answered(self, req: m.AlterSyncStateSet, resp: m.Response | None, now: int) -> list[Effect]:
        r = self.replica
        if resp is None:
            log.warning("broker %s: SyncStateSet %s: no answer; sending it again", self.settings.name,
                        req.sync_state_set)
        elif resp.code == ResponseCode.UNAUTHENTICATED:
            # not over our heartbeats' connection yet (a new one: the next heartbeat rebinds
            # it), or not our certificate's id: sent again after a pause
            self._warn("alter refused", "broker %s: SyncStateSet %s refused: %s; sending it again",
                       self.settings.name, req.sync_state_set, resp.remark)
            resp = None
        r.alter_answered(req, resp)
        if r.unresolved:
            return [self._alter_ask(m.GetReplicaInfo(self.settings.name), now)]
        if resp is None:
            return self._alter_pause(now)
        log.info("broker %s: SyncStateSet %s (epoch %d)", self.settings.name, sorted(r.sync_state_set),
                 r.sync_state_set_epoch)
        return self._alter_resume(now)

    def _alter_read(self, info: m.Response | None, now: int) -> list[Effect]:
        """The controller's set, read after a refused proposal."""
        r = self.replica
        if info is not None and info.code == RC.SUCCESS and info.master_epoch is not None:
            r.sync_state_set_read(info.master_epoch, set(info.sync_state_set or ()), info.sync_state_set_epoch or 0)
        if r.unresolved:
            return self._alter_pause(now)
        return self._alter_resume(now)

    def _alter_pause(self, now: int) -> list[Effect]:
        self._alter_paused_until = now + self.settings.alter_retry_ms
        return []

    def _alter_resume(self, now: int) -> list[Effect]:
        """After an answer (or the pause after none): release what the set change allows, then
        the next change."""
        return self._release(now) + self._alter_next(now)

    # --- HA progress ---------------------------------------------------------------------------

    def slave_acked(self, now: int) -> list[Effect]:
        """A slave's ack reached the master's HA service: the confirm offset and waiting sends."""
        with self._settled(now):
            return self._release(now)

    def slave_progress(self, now: int) -> list[Effect]:
        """A slave's log or confirm offset moved (a frame from its master)."""
        self.replica.sync_slave_truncation()
        return [ConfirmMoved()]

    def _after_confirm_change(self) -> list[Effect]:
        ha = self.replica.master_ha
        if ha is not None:
            before = ha.confirm_offset
            if ha.recompute_confirm() != before:
                return [ConfirmMoved()]
        return []

    # --- sends ---------------------------------------------------------------------------------

    def send(self, send_id: int, bodies: Sequence[bytes], now: int) -> list[Effect]:
        """A producer's send (already decoded and addressed to us): refused, or written and
        answered once durable and acknowledged (`SendDone`)."""
        r = self.replica
        refusal = r.send_refusal(now)
        if refusal is not None:
            return [SendDone(send_id, refusal)]
        ha, epoch = r.master_ha, r.master_epoch
        assert ha is not None
        result = r.append(bodies)
        s = _Send(send_id, epoch, ha, result.first_index, list(result.positions), self.log.max_offset,
                  result.first_index + len(bodies) - 1)
        out: list[Effect] = [WakeHA(), *self._after_confirm_change()]
        if self.settings.wait_durable:
            self._durable_wait.append(s)
            out.append(AwaitDurable(s.durable_index))
            return out
        return out + self._wait_acks(s, now)

    def durable(self, now: int, index: int) -> list[Effect]:
        """Entries up to `index` are fsynced: the sends waiting for them wait for their acks
        (and a master's own copy now counts for the confirm offset)."""
        out = self._safely("reading the confirm offset", self._release, now)
        while self._durable_wait and self._durable_wait[0].durable_index <= index:
            out += self._wait_acks(self._durable_wait.popleft(), now)
        return out

    def durable_failed(self, now: int, index: int, error: DLedgerError) -> list[Effect]:
        """Waiting for entries up to `index` to be fsynced failed (the store's flush): the
        sends waiting for them are answered with `error` (written, not known durable)."""
        out: list[Effect] = []
        while self._durable_wait and self._durable_wait[0].durable_index <= index:
            out.append(SendDone(self._durable_wait.popleft().send_id, error))
        return out

    def _wait_acks(self, s: _Send, now: int) -> list[Effect]:
        if self.replica.acked(s.next_offset):
            return [self._finish(s, now)]
        s.deadline_ms = now + self.settings.slave_timeout_ms
        self._ack_wait.append(s)
        return []

    def _finish(self, s: _Send, now: int) -> SendDone:
        r = self.replica
        if r.master_ha is not s.ha or r.master_epoch != s.epoch or not r.lease_valid(now):
            return SendDone(s.send_id, DLedgerError(
                ResponseCode.FLUSH_SLAVE_TIMEOUT, "written, but mastership or lease was lost before the send was "
                "acknowledged: it may or may not be kept"))
        return SendDone(s.send_id, bm.SendResponse(s.epoch, s.first_index, s.positions))

    def _release(self, now: int) -> list[Effect]:
        """The sends now on enough copies, in order."""
        out = self._after_confirm_change()
        while self._ack_wait and self.replica.acked(self._ack_wait[0].next_offset):
            out.append(self._finish(self._ack_wait.popleft(), now))
        return out

    def _expire(self, now: int) -> list[Effect]:
        out = self._release(now)  # a SyncStateSet change may have released some
        while self._ack_wait and self._ack_wait[0].deadline_ms <= now:
            s = self._ack_wait.popleft()
            out.append(SendDone(s.send_id, DLedgerError(
                ResponseCode.FLUSH_SLAVE_TIMEOUT, f"written on master {self.settings.name} but not acknowledged by "
                f"enough replicas within {self.settings.slave_timeout_ms} ms")))
        return out

    def _fail_sends(self, code: ResponseCode, text: str) -> list[Effect]:
        out: list[Effect] = []
        for queue in (self._durable_wait, self._ack_wait):
            while queue:
                out.append(SendDone(queue.popleft().send_id, DLedgerError(code, text)))
        return out
