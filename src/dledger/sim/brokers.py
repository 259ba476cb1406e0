"""Controllers and a broker set under seeded faults, in simulated time (docs/brokers.md).

`python -m dledger.sim --brokers --seeds N`. One broker set of three replicas: each the
shipped BrokerAgent (every decision a broker makes: registration, roles, the alter loop, the
lease heartbeat, ack waits; the same object BrokerServer drives) over a BrokerLog on a
SimDiskStore (durable only once "fsynced"), with the sans-I/O HA pieces talking over
simulated FIFO connections; `Broker` is only the agent's driver, as BrokerServer is. The
controller group is one linearizable state machine (ControllerStateMachine's `process`) with
the service's Liveness (heartbeats, lease grants, the new leader's grace, which sets need an
election); a controller leader failover stops grants at once (the old leader's Raft lease)
and brings a new leader after a gap. Brokers use all-ack: a send is acknowledged once on
every SyncStateSet member and while the master's lease holds. Even seeds run flush=sync (on
every member's disk: a slave acks what it fsynced); odd seeds the runtime's default,
flush=async (in every member's page cache). There a power loss takes the master's tail that
only the page caches held (acknowledged: its slaves hold it) and it restarts quickly,
usually before the controllers count it dead; the election after its registration must make
a slave holding that tail master. Two such faults at once may lose acknowledged records by
design (docs/brokers.md), so no other broker fault follows for a while, and the async
seeds' other crashes are kills.

Faults by seed: broker kills (the page cache survives) and power losses (it does not; with
flush=async, of the master, whose written-back page cache leaves a 20-400 ms tail to lose),
partitions between a broker and the controllers (a master cut off from them but not from its
slaves) or between brokers, slow disks, lost controller replies (an election's answer too: its
entry is applied after its proposer gave up), controller leader failovers (any member may lead next),
and forgeries (docs/brokers.md): a NOTIFY naming any master and epoch up to 2**31-1 (a broker
takes it as a hint and asks the controller), a heartbeat for the master with lease_ms=0 on a
connection that then closes (the lease still holds), an alter-sync-state-set on a connection
that carries no heartbeats of the master (refused).

Invariants, after every event:
- at most one broker holds a valid master lease at any moment, so at most one acknowledges;
- every acknowledged record is, byte for byte, on every member of the controller's
  SyncStateSet (all-ack), but a flush=async master that lost power need not hold what it
  acknowledged before (its slaves must);
- a replica's confirm offset never goes back while it runs;
- running replicas agree byte for byte up to the lesser of their confirm offsets.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from functools import partial

from dledger.broker import messages as bm
from dledger.broker.agent import (
    AgentSettings,
    AwaitDurable,
    BrokerAgent,
    CallController,
    ConfirmMoved,
    Effect,
    FollowMaster,
    Register,
    ResetHA,
    SaveConfirm,
    SendDone,
    SendHeartbeat,
    WakeHA,
)
from dledger.broker.epoch_file import EpochFileCache
from dledger.broker.ha_master import HAConfig, HAProtocolError
from dledger.broker.ha_packets import PacketError
from dledger.broker.ha_service import AckSettings, MasterHA
from dledger.broker.ha_slave import SlaveClient
from dledger.broker.log import BrokerLog
from dledger.broker.replica import BrokerRole, ReplicaState
from dledger.codes import ControllerResponseCode as RC
from dledger.codes import DLedgerError, ResponseCode
from dledger.controller import messages as m
from dledger.controller.config import ControllerConfig
from dledger.controller.heartbeats import HeartbeatTable
from dledger.controller.leader import ControllerLeader, Notify, Refuse, Wait
from dledger.controller.liveness import Liveness
from dledger.controller.machine import ControllerStateMachine
from dledger.controller.processor import process
from dledger.sim.disk import SimDiskStore

log = logging.getLogger(__name__)

NAME, CLUSTER = "b0", "sim"
IDS = (1, 2, 3)
CTL = "ctl"
DURATION_MS = 24_000
HEAL_MS = 8_000  # after the last fault: time to converge before the end checks
HA = HAConfig(heartbeat_ms=500, housekeeping_ms=2_000, transfer_batch_bytes=8 << 10, max_not_catchup_ms=2_000)
ACKS = AckSettings(all_ack=True)
LEASE_MS, HEARTBEAT_MS, SLAVE_TIMEOUT_MS = 1_000, 300, 3_000
CALL_TIMEOUT_MS = 3_000  # a request to the controller leader (the runtime's ControllerClient timeout)
# (wait_durable, flush=sync or not, is the seed's: BrokerSim.flush_sync)
SETTINGS = AgentSettings(CLUSTER, NAME, "", heartbeat_interval_ms=HEARTBEAT_MS, sync_metadata_ms=1_000,
                         check_sync_state_set_ms=1_000, slave_timeout_ms=SLAVE_TIMEOUT_MS, wait_durable=True)
CONTROLLER = ControllerConfig(broker_heartbeat_timeout_ms=1_500, broker_lease_drift_ms=200)
CONTROLLERS = 3  # members of the controller group
# faults that take a broker or its connections away; none for this long after a flush=async
# master's power loss (the election, then its catching up as a slave)
BROKER_FAULTS = ("kill", "power", "partition_ctl", "partition_peer", "isolate_master", "kill_master_and_controller")
ASYNC_POWER_QUIET_MS = 8_000


class Cut(SimDiskStore):
    """A SimDiskStore that counts what can remove bytes (truncations, power losses)."""

    def __init__(self) -> None:
        super().__init__()
        self.cuts = 0

    def truncate(self, from_index: int) -> None:
        self.cuts += 1
        super().truncate(from_index)

    def crash(self) -> None:
        self.cuts += 1
        super().crash()

    def flush(self) -> int:
        """A blocking fsync of everything written (a new master's, before its epoch entry)."""
        self.sync_all()
        return self.durable_index

    def bytes_at(self, start: int, end: int) -> bytes:
        return bytes(self._buf[start - self._base_pos : end - self._base_pos])


@dataclass
class Acked:
    start: int
    end: int
    data: bytes
    broker: int
    epoch: int
    at: int


@dataclass
class Pipe:
    """One HA connection: FIFO both ways, closed when either side restarts or changes role."""

    master: Broker
    slave: Broker
    ha: MasterHA
    client: SlaveClient
    key: object = field(default_factory=object)
    open: bool = True
    m_inc: int = 0
    s_inc: int = 0
    down_at: int = 0  # FIFO: the last delivery time each way
    up_at: int = 0


class Broker:
    """One replica: the shipped BrokerAgent, driven in simulated time (this class is its
    driver, as BrokerServer is at runtime: it carries out the agent's effects)."""

    def __init__(self, sim: BrokerSim, broker_id: int) -> None:
        self.sim, self.id = sim, broker_id
        self.incarnation = 0
        self.disk = Cut()
        self.disk.on_request = lambda: sim.after(sim.fsync_ms(self.id), self._flushed, self.incarnation)
        self.log = BrokerLog(self.disk)
        self.epochs = EpochFileCache()  # written through (temp + rename): it survives any crash
        self.up = False
        self.saved_confirm = -1
        self.agent = self._fresh()
        self.pipes: list[Pipe] = []
        self.sends: dict[int, tuple[int, int]] = {}  # send id -> the bytes it wrote, [start, end)
        self._send_ids = itertools.count(1)
        self._armed = 0  # when the agent's next tick is scheduled
        self.last_confirm = -1
        self.lost_acked = 0  # acknowledged records before its last flush=async power loss (it may lack them)

    def _fresh(self) -> BrokerAgent:
        settings = replace(SETTINGS, address=self.address, wait_durable=self.sim.flush_sync)
        return BrokerAgent(settings, self.log, self.epochs, HA, ACKS, LEASE_MS, now_ms=self.sim.now, broker_id=self.id,
                           confirm_offset=self.saved_confirm)

    @property
    def replica(self) -> ReplicaState:
        return self.agent.replica

    @property
    def address(self) -> str:
        return f"b{self.id}"

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self.up:
            return  # the heal restarted it before its own restart came
        self.up, self.incarnation = True, self.incarnation + 1
        self.agent = self._fresh()
        self.last_confirm = self.replica.confirm_offset
        self.sim.trace(f"b{self.id} up (log {self.log.max_offset}, epochs {self.epochs.entries})")
        self._armed = -1
        self._wake(self.incarnation, -1)
        self._tick(self.incarnation)

    def stop(self, power_loss: bool) -> None:
        self.up = False
        self.sends.clear()
        for p in list(self.pipes):
            self.sim.close(p, "crash")
        if power_loss:
            self.disk.crash()
        else:
            self.disk.sync_all()  # a killed process: the page cache survives and reaches the disk
        self.sim.controller.connection_closed((self.id, self.incarnation))
        self.sim.trace(f"b{self.id} {'power loss' if power_loss else 'killed'} (log {self.log.max_offset})")

    # --- the agent's inputs and effects ------------------------------------------------------

    def run(self, effects: list[Effect]) -> None:
        """Carry out what the agent decided, in order (as BrokerServer._run)."""
        if not self.up:
            return
        for e in effects:
            match e:
                case SendDone(send_id, result):
                    start, end = self.sends.pop(send_id, (0, 0))
                    if isinstance(result, bm.SendResponse):
                        self.sim.acknowledge(Acked(start, end, self.disk.bytes_at(start, end), self.id,
                                                   result.epoch, self.sim.now))
                case CallController(token, req):
                    self._ask(req, CALL_TIMEOUT_MS, partial(self._answered, token))
                case SendHeartbeat(token, hb):
                    self._ask(hb, HEARTBEAT_MS * 3, partial(self._beat_answered, token))
                case Register(token):
                    self._ask(m.RegisterBroker(CLUSTER, NAME, self.id, self.address), CALL_TIMEOUT_MS,
                              partial(self._registered, token))
                case WakeHA() | ConfirmMoved():
                    self.pump()
                case AwaitDurable():
                    self.disk.request_flush()
                case ResetHA():
                    self.sim.trace(f"b{self.id} {self.replica.role.value} at epoch {self.replica.master_epoch}")
                    for p in list(self.pipes):
                        self.sim.close(p, "role change")
                case FollowMaster():
                    pass  # the slave tick connects (the runtime's SlaveRunner)
                case SaveConfirm(offset):
                    self.saved_confirm = offset
        self.sim.check_confirm(self)
        self._arm()

    def _ask(self, req: m.Request, timeout_ms: int, answer: Callable[[m.Response | None], list[Effect]]) -> None:
        """A request to the controllers, answered once: their answer, or None after the timeout."""
        inc, done = self.incarnation, [False]

        def once(resp: m.Response | None) -> None:
            if done[0] or not self.up or self.incarnation != inc:
                return
            done[0] = True
            self.run(answer(resp))

        self.sim.call_controller(self, req, once)
        self.sim.after(timeout_ms, once, None)

    def _answered(self, token: int, resp: m.Response | None) -> list[Effect]:
        return self.agent.answered(token, self.sim.now, resp)

    def _beat_answered(self, token: int, resp: m.Response | None) -> list[Effect]:
        return self.agent.heartbeat_answered(token, self.sim.now, [resp] if resp is not None else [])

    def _registered(self, token: int, resp: m.Response | None) -> list[Effect]:
        """(The ids were applied for before the run: a registration pass is REGISTER_BROKER.)"""
        ok = resp is not None and resp.code == RC.SUCCESS
        return self.agent.register_answered(token, self.sim.now, self.id, resp if ok else None)

    def _arm(self) -> None:
        """Schedule the agent's next tick when it wants one earlier than the one scheduled."""
        at = max(self.agent.next_tick_at(), self.sim.now)
        if self._armed < self.sim.now or at < self._armed:
            self._armed = at
            self.sim.after(at - self.sim.now, self._wake, self.incarnation, at)

    def _wake(self, inc: int, at: int) -> None:
        if self.up and inc == self.incarnation and at == self._armed:
            self._armed = -1
            self.run(self.agent.tick(self.sim.now))

    def hint(self, note: m.NotifyBrokerRoleChanged | None = None) -> None:
        """A NOTIFY (the controller's or a forged one): the agent asks the controller leader;
        a note's own fields are never used."""
        if self.up:
            self.run(self.agent.hint(self.sim.now))

    def proposal(self) -> None:
        self.run(self.agent.proposal(self.sim.now))

    def send(self, bodies: list[bytes]) -> None:
        if not self.up:
            return
        send_id, start = next(self._send_ids), self.log.max_offset
        try:
            effects = self.agent.send(send_id, bodies, self.sim.now)
        except DLedgerError:
            return
        self.sends[send_id] = (start, self.log.max_offset)
        self.run(effects)

    # --- HA: what the runtime's HAListener and SlaveRunner do ---------------------------------

    def _tick(self, inc: int) -> None:
        """Every 100 ms: HA timers and connects, and the agent's housekeeping (as the runtime's)."""
        if not self.up or inc != self.incarnation:
            return
        now = self.sim.now
        self.run(self.agent.tick(now))
        r = self.replica
        if r.slave is not None:
            self._slave_tick(now)
        if r.master_ha is not None:
            for p in list(self.pipes):
                if (conn := r.master_ha.connections.get(p.key)) is not None and conn.expired(now):
                    self.sim.close(p, "housekeeping")
            self.pump()
        self.sim.after(100, self._tick, inc)

    def _slave_tick(self, now: int) -> None:
        c = self.replica.slave
        assert c is not None
        pipe = next((p for p in self.pipes if p.client is c), None)
        if pipe is None:
            master = self.sim.brokers.get(self.replica.master_id or 0)
            if master is not None and master.up and master.replica.master_ha is not None \
                    and not self.sim.blocked(self.address, master.address):
                self.sim.connect(master, self)
            return
        if c.expired(now):
            self.sim.close(pipe, "slave housekeeping")
            return
        self.sim.send_up(pipe, c.tick(now) + c.ack_if_grew(now))

    def _flushed(self, inc: int) -> None:
        if inc != self.incarnation or not self.up:
            return
        self.disk.complete_flush()
        if self.replica.slave is not None:
            pipe = next((p for p in self.pipes if p.client is self.replica.slave), None)
            if pipe is not None:
                self.sim.send_up(pipe, self.replica.slave.ack_if_grew(self.sim.now))
        self.run(self.agent.durable(self.sim.now, self.disk.durable_index))

    def pump(self) -> None:
        """The master writes what each connection has to send."""
        ha = self.replica.master_ha
        if ha is None:
            return
        for p in list(self.pipes):
            conn = ha.connections.get(p.key)
            if p.master is self and conn is not None and p.open:
                try:
                    frames = conn.output(self.sim.now, ha.confirm_offset, 64 << 10)
                except (HAProtocolError, DLedgerError) as e:  # as the runtime: the connection goes
                    self.sim.trace(f"b{self.id}: HA connection of b{p.slave.id} closed: {e}")
                    self.sim.close(p, "master error")
                    continue
                self.sim.send_down(p, frames)


class SimControllerGroup:
    """The controller group as one linearizable log and state machine, driving the shipped
    leader (controller.leader.ControllerLeader) as ControllerService does: heartbeats and
    leases, when an election may be logged, the scan, and whom to push a new master to.

    Three members, each with its own ControllerLeader kept across terms (a member that leads
    again finds what it knew); they share one heartbeat table (every controller takes every
    broker's heartbeats). Entries are logged at increasing indexes and applied in order; while
    replies are being lost, an election's answer may be lost too: its entry is logged, the
    log stalls (applies nothing) for a while, the proposer hears nothing before its timeout
    (the election is in doubt), and the entry is applied after (it still takes effect)."""

    def __init__(self, sim: BrokerSim) -> None:
        self.sim = sim
        self.machine = ControllerStateMachine()
        table = HeartbeatTable(CONTROLLER.broker_heartbeat_timeout_ms, CONTROLLER.broker_lease_drift_ms)
        self.members = [ControllerLeader(CONTROLLER, table) for _ in range(CONTROLLERS)]
        self.leader = self.members[0]
        self.term = 1
        self.available = True
        self.lose_replies = False
        self.last_index = -1  # the log's last index
        self.applied_index = -1
        self._pending: list[tuple[m.Command, Callable[[m.Response], None]]] = []  # logged, not yet applied
        self._stalls = 0  # lost election answers whose entries are not applied yet
        for i in IDS:  # ids applied for and accepted before the run (registration is tested apart)
            self._log(self.leader.command(m.ApplyBrokerId(CLUSTER, NAME, i, f"b{i};0"), sim.now), lambda _: None)
        sim.after(sim.rng.randint(2_000, DURATION_MS), self._admin_fault)

    @property
    def liveness(self) -> Liveness:
        return self.leader.liveness

    def _log(self, cmd: m.Command, done: Callable[[m.Response], None]) -> None:
        """Log `cmd` (reads too: a linearizable query waits for what was logged before it);
        `done` gets its answer once applied (at once unless the log stalls)."""
        self.last_index += 1
        self._pending.append((cmd, done))
        self._apply_pending()

    def _apply_pending(self) -> None:
        while self._pending and not self._stalls:
            cmd, done = self._pending.pop(0)
            resp, events = process(self.machine.state, cmd)
            for ev in events:
                self.machine.state.apply(ev)
            self.applied_index += 1
            done(resp)

    def handle(self, conn: Hashable, req: m.Request, answer: Callable[[m.Response], None]) -> None:
        """A request on connection `conn` (a broker incarnation's, or a forger's); `answer` is
        called with the answer, now or (an election waiting out a lease, a stalled log) later,
        or never."""
        now = self.sim.now
        if isinstance(req, m.BrokerHeartbeat):
            answer(self.leader.heartbeat(req, now, conn, self.available))
            return
        if not self.available:
            return
        assert isinstance(req, m.WriteRequest | m.ReadRequest)
        if isinstance(req, m.AlterSyncStateSet) and (problem := self.leader.alter_refusal(req, conn)) is not None:
            answer(m.Response(int(ResponseCode.UNAUTHENTICATED), problem))
            return
        if not isinstance(req, m.ElectMaster):
            leader, term = self.leader, self.term

            def applied(resp: m.Response) -> None:  # answered only by the member that took it, still leading
                if self.available and self.leader is leader and self.term == term:
                    answer(resp)

            self._log(self.leader.command(req, now), applied)
            return
        self.elect(req, answer)

    def elect(self, req: m.ElectMaster, answer: Callable[[m.Response], None] = lambda _: None,
              deadline: int | None = None, lose: bool = False) -> None:
        """As the service's _elect: logged once the leader says no lease it granted can still
        hold a master this election could replace; its pushes sent after; its answer lost
        (the election in doubt) if `lose`, or at random while replies are being lost."""
        now = self.sim.now
        if deadline is None:
            deadline = now + CONTROLLER.request_timeout_ms
        leader, term = self.leader, self.term
        step = leader.election_step(req, now, deadline)
        if isinstance(step, Refuse):
            answer(step.response)
            return
        if isinstance(step, Wait):
            self.sim.trace(f"election waits {step.ms} ms for the master's lease")

            def again() -> None:  # the same member, still leading in the same term, proposes it
                if self.available and self.leader is leader and self.term == term:
                    self.elect(req, answer, deadline, lose)
                else:  # else its proposal is refused before it is stored (the service's NOT_LEADER)
                    answer(m.Response(int(RC.CONTROLLER_NOT_LEADER), "the controller is not leader"))

            self.sim.after(step.ms, again)
            return
        if lose or (self.lose_replies and self.sim.rng.random() < 0.5):
            self._lose_answer(leader, step.command, answer)
            return

        def applied(resp: m.Response) -> None:
            if resp.code == RC.SUCCESS:
                self.sim.trace(f"controller elected b{resp.master_broker_id} at epoch {resp.master_epoch}")
            for push in leader.election_ended(NAME, resp, self.sim.now):
                self._push(leader, push)
            answer(resp)

        self._log(step.command, applied)

    def _admin_fault(self) -> None:
        """Once a run: an admin names another replica master; half the time its answer is lost
        while its entry still applies (the election in doubt: no lease in the set meanwhile)."""
        s = self.machine.state.get(NAME)
        target = self.sim.rng.choice([i for i in IDS if s is None or i != s.master_id])
        lose = self.sim.rng.random() < 0.5
        self.sim.trace(f"fault admin_elect (b{target}{', its answer lost' if lose else ''})")
        self.admin_elect(target, lose)

    def admin_elect(self, broker_id: int, lose: bool) -> None:
        """An admin names the next master (as the service's _serve: the set's leases revoked
        for the election's whole wait and life); its answer lost if `lose`."""
        if not self.available:
            return
        leader = self.leader
        leader.revoke(NAME, self.sim.now)

        def done(resp: m.Response) -> None:
            leader.end_revoke(NAME)
            self.sim.trace(f"admin election of b{broker_id} answered {resp.code}")

        self.elect(m.ElectMaster(CLUSTER, NAME, broker_id, designate_elect=True), done, lose=lose)

    def _lose_answer(self, leader: ControllerLeader, cmd: m.Command, answer: Callable[[m.Response], None]) -> None:
        """The election is logged, but the log stalls: its proposer times out first (the
        election in doubt: "it may still take effect"), and the entry is applied after."""
        timeout = self.sim.rng.randint(100, 600)
        stall = timeout + self.sim.rng.randint(100, 1_500)
        self._stalls += 1
        term = self.term

        def applied(resp: m.Response) -> None:
            self.sim.trace(f"an election whose answer was lost applied: {resp.code} b{resp.master_broker_id} "
                           f"at epoch {resp.master_epoch}")

        self._log(cmd, applied)
        index = self.last_index
        self.sim.trace(f"controller election logged at {index}; its answer is lost, the log stalls {stall} ms")

        def timed_out() -> None:  # the proposer's bound: its entry is at or before this index
            leader.election_ended(NAME, None, self.sim.now, (term, max(index, self.last_index)))
            answer(m.Response(int(RC.SYSTEM_ERROR), "not applied in time: it may still take effect"))

        def unstall() -> None:
            self._stalls -= 1
            self._apply_pending()

        self.sim.after(timeout, timed_out)
        self.sim.after(stall, unstall)

    def _push(self, leader: ControllerLeader, push: Notify) -> None:
        """A NOTIFY on its way to a broker (a network delay; lost if it is down or cut off)."""
        b = self.sim.brokers.get(push.broker_id)
        epoch = push.note.master_epoch

        def arrive() -> None:
            leader.notify_done(push.address, epoch)
            if b is not None and b.up and not self.sim.blocked(CTL, b.address):
                b.hint(push.note)

        self.sim.after(self.sim.rng.randint(1, 20), arrive)

    def connection_closed(self, conn: Hashable) -> None:
        self.leader.connection_closed(conn, self.sim.now)

    def scan(self) -> None:
        """As the service's scan, every scan_interval_ms: the state it reads is applied up to
        `applied_index` while the log ends at `last_index`."""
        leader = self.leader
        if not self.available:
            leader.tick(self.sim.now, None)
        else:
            for req in leader.tick(self.sim.now, self.term, self.machine.brief(), self.applied_index,
                                   self.last_index):
                self.elect(req, functools.partial(leader.scan_election_done, req.broker_name))
        self.sim.after(CONTROLLER.scan_interval_ms, lambda: self.scan())

    def failover(self, gap_ms: int) -> None:
        """The leader is lost: no grants at once (its Raft lease ended before anyone else
        leads), a new leader after `gap_ms` (any member, the old one too) with the heartbeats
        it saw as a follower."""
        self.available = False
        self.leader.tick(self.sim.now, None)
        self.sim.trace(f"controller leader lost for {gap_ms} ms")

        def back() -> None:
            self.term += 1
            k = self.sim.rng.randrange(len(self.members))
            self.leader = self.members[k]
            self.available = True
            self.sim.trace(f"controller leader c{k} at term {self.term}")

        self.sim.after(gap_ms, back)


@dataclass
class BrokerSimReport:
    seed: int
    flush: str = "sync"
    ok: bool = True
    acked: int = 0
    faults: int = 0
    elections: int = 0
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"seed {self.seed} (flush={self.flush}): {'ok' if self.ok else 'FAILED'}, {self.acked} acknowledged "
                f"sends, {self.faults} faults, {self.elections} elections")


class BrokerSim:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.flush_sync = seed % 2 == 0  # (no draw from rng: a seed's faults are the same either way)
        self.now = 0
        self._queue: list[tuple[int, int, Callable[..., None], tuple[object, ...]]] = []
        self._seq = itertools.count()
        self.partitions: set[frozenset[str]] = set()
        self.slow_disks: set[int] = set()
        self.controller = SimControllerGroup(self)
        self.brokers = {i: Broker(self, i) for i in IDS}
        self.acked: list[Acked] = []
        self.verified: dict[int, tuple[int, int]] = {}  # broker -> (cuts seen, acked records verified)
        self.report = BrokerSimReport(seed, "sync" if self.flush_sync else "async")
        self.events = 0
        self.quiet_until = 0  # no broker faults before (after a flush=async master's power loss)

    # --- plumbing --------------------------------------------------------------------------

    def after(self, delay: int, fn: Callable[..., None], *args: object) -> None:
        heapq.heappush(self._queue, (self.now + max(0, delay), next(self._seq), fn, args))

    def trace(self, text: str) -> None:
        self.report.trace.append(f"{self.now:>6} {text}")

    def blocked(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self.partitions

    def fsync_ms(self, broker: int) -> int:
        return self.rng.randint(500, 2500) if broker in self.slow_disks else self.rng.randint(1, 5)

    def delay(self) -> int:
        return self.rng.randint(1, 8)

    def call_controller(self, broker: Broker, req: m.Request, on_reply: Callable[[m.Response], None]) -> None:
        """A request to the controller leader and its answer, each way after a network delay;
        dropped by a partition, answered by nobody during a leader failover, the answer lost
        while replies are being lost."""
        inc = broker.incarnation

        def arrive() -> None:  # (a connection closes after what was sent on it arrived: the stop closes it)
            if not self.blocked(broker.address, CTL) and broker.up and broker.incarnation == inc:
                self.controller.handle((broker.id, inc), req, deliver)

        def deliver(resp: m.Response) -> None:
            if not (self.controller.lose_replies and self.rng.random() < 0.5):
                self.after(self.delay(), reply, resp)

        def reply(resp: m.Response) -> None:
            if broker.up and broker.incarnation == inc and not self.blocked(broker.address, CTL):
                on_reply(resp)

        if not self.blocked(broker.address, CTL):
            self.after(self.delay(), arrive)

    # --- HA connections ----------------------------------------------------------------------

    def connect(self, master: Broker, slave: Broker) -> None:
        ha, client = master.replica.master_ha, slave.replica.slave
        assert ha is not None and client is not None
        p = Pipe(master, slave, ha, client, m_inc=master.incarnation, s_inc=slave.incarnation)
        ha.opened(p.key, self.now)
        master.pipes.append(p)
        slave.pipes.append(p)
        self.send_up(p, client.connected(self.now))

    def _live(self, p: Pipe) -> bool:
        ok = (p.open and p.master.up and p.slave.up and p.master.incarnation == p.m_inc
              and p.slave.incarnation == p.s_inc and p.master.replica.master_ha is p.ha
              and p.slave.replica.slave is p.client)
        if not ok and p.open:
            self.close(p, "gone")
        return ok

    def close(self, p: Pipe, why: str) -> None:
        if not p.open:
            return
        p.open = False
        for b in (p.master, p.slave):
            if p in b.pipes:
                b.pipes.remove(p)
        p.client.disconnected()
        proposal = p.ha.closed(p.key)
        if proposal is not None and p.master.up and p.master.replica.master_ha is p.ha:
            p.master.proposal()

    def send_down(self, p: Pipe, frames: list[bytes]) -> None:
        if frames:
            p.down_at = max(p.down_at, self.now + self.delay())
            self.after(p.down_at - self.now, self._deliver_down, p, b"".join(frames))

    def send_up(self, p: Pipe, packets: list[bytes]) -> None:
        if packets:
            p.up_at = max(p.up_at, self.now + self.delay())
            self.after(p.up_at - self.now, self._deliver_up, p, b"".join(packets))

    def _deliver_down(self, p: Pipe, data: bytes) -> None:
        if not self._live(p):
            return
        try:
            out = p.client.receive(data, self.now)
        except (HAProtocolError, PacketError, DLedgerError) as e:
            self.trace(f"b{p.slave.id}: HA closed: {e}")
            self.close(p, "slave error")
            return
        p.slave.disk.request_flush()
        self.send_up(p, out)
        p.slave.run(p.slave.agent.slave_progress(self.now))

    def _deliver_up(self, p: Pipe, data: bytes) -> None:
        if not self._live(p):
            return
        try:
            proposal = p.ha.on_data(p.key, data, self.now)
        except (HAProtocolError, PacketError) as e:
            self.trace(f"b{p.master.id}: HA connection of b{p.slave.id} closed: {e}")
            self.close(p, "master error")
            return
        if proposal is not None:
            p.master.proposal()
        p.master.run(p.master.agent.slave_acked(self.now))
        p.master.pump()

    # --- invariants --------------------------------------------------------------------------

    def violation(self, text: str) -> None:
        self.report.violations.append(f"{self.now}: {text}")

    def acknowledge(self, a: Acked) -> None:
        others = [b.id for b in self.brokers.values() if b.id != a.broker and b.up and b.replica.lease_valid(self.now)]
        if others:
            self.violation(f"b{a.broker} acknowledged while b{others} also held a master lease")
        self.acked.append(a)

    def check_confirm(self, b: Broker) -> None:
        c = b.replica.confirm_offset
        if c < b.last_confirm:
            self.violation(f"b{b.id}'s confirm offset went back from {b.last_confirm} to {c}")
        b.last_confirm = max(b.last_confirm, c)

    def check(self) -> None:
        leased = [b.id for b in self.brokers.values() if b.up and b.replica.lease_valid(self.now)]
        if len(leased) > 1:
            self.violation(f"two masters hold a lease: {leased}")
        s = self.controller.machine.state.get(NAME)
        for i in s.sync_state_set if s is not None else ():
            self._check_acked_on(self.brokers[i])
        if self.events % 25 == 0:
            self._check_agreement()

    def _check_acked_on(self, b: Broker) -> None:
        cuts, done = self.verified.get(b.id, (-1, 0))
        if cuts != b.disk.cuts:
            done = 0  # bytes may have been removed: check everything again
        # a master whose flush=async tail a power loss took may lack what it acknowledged
        # before (its slaves hold it: the election must make one of them master)
        done = max(done, b.lost_acked)
        for a in self.acked[done:]:
            if b.log.max_offset < a.end or b.disk.bytes_at(a.start, a.end) != a.data:
                self.violation(f"record [{a.start}, {a.end}) acknowledged by b{a.broker} at {a.at} is not on "
                               f"SyncStateSet member b{b.id} (its log ends at {b.log.max_offset})")
                break
            done += 1
        self.verified[b.id] = (b.disk.cuts, done)

    def _check_agreement(self) -> None:
        up = [b for b in self.brokers.values() if b.up]
        for x, y in itertools.combinations(up, 2):
            n = min(x.replica.confirm_offset, y.replica.confirm_offset)
            if n > 0 and x.disk.bytes_at(0, n) != y.disk.bytes_at(0, n):
                self.violation(f"b{x.id} and b{y.id} differ below their confirm offsets ({n})")

    # --- the run -----------------------------------------------------------------------------

    def run(self) -> BrokerSimReport:
        for b in self.brokers.values():
            self.after(self.rng.randint(0, 200), b.start)
        self.after(0, self.controller.scan)
        self.after(500, self._client)
        self._schedule_faults()
        end = DURATION_MS + HEAL_MS
        while self._queue and self.now <= end and len(self.report.violations) < 5:
            t, _, fn, args = heapq.heappop(self._queue)
            self.now = t
            fn(*args)
            self.events += 1
            self.check()
        self._final_checks()
        self.report.acked = len(self.acked)
        s = self.controller.machine.state.get(NAME)
        self.report.elections = s.master_epoch if s is not None else 0
        self.report.ok = not self.report.violations
        return self.report

    def _client(self) -> None:
        s = self.controller.machine.state.get(NAME)
        if s is not None and s.master_id is not None:
            n = self.rng.randint(1, 3)
            self.brokers[s.master_id].send([self.rng.randbytes(self.rng.randint(0, 300)) for _ in range(n)])
        if self.now < DURATION_MS + HEAL_MS - 2_000:
            self.after(self.rng.randint(5, 30), self._client)

    def _schedule_faults(self) -> None:
        t = 2_000
        while t < DURATION_MS:
            self.after(t, self._fault)
            t += self.rng.randint(1_000, 4_000)
        self.after(DURATION_MS, self._heal_all)

    def _fault(self) -> None:
        self.report.faults += 1
        kind = self.rng.choice(["kill", "power", "partition_ctl", "partition_peer", "isolate_master", "slow_disk",
                                "lost_replies", "controller_failover", "kill_master_and_controller", "forge"])
        ids = list(IDS)
        target = self.rng.choice(ids)
        s = self.controller.machine.state.get(NAME)
        master = s.master_id if s is not None and s.master_id is not None else target
        self.trace(f"fault {kind} (b{target}, master b{master})")
        if kind in BROKER_FAULTS and self.now < self.quiet_until:
            self.trace("(skipped: a flush=async master's power loss is being recovered from)")
        elif kind == "power" and not self.flush_sync:
            self._async_power_loss(master, self.rng.randint(20, 400), self.rng.randint(50, 1_000))
        elif kind in ("kill", "power"):
            self._crash(target, kind == "power", self.rng.randint(300, 3_000))
        elif kind == "partition_ctl":
            self._cut(f"b{target}", CTL, self.rng.randint(500, 4_000))
        elif kind == "partition_peer":
            other = self.rng.choice([i for i in ids if i != target])
            self._cut(f"b{target}", f"b{other}", self.rng.randint(500, 4_000))
        elif kind == "isolate_master":  # from the controllers, not from its slaves
            self._cut(f"b{master}", CTL, self.rng.randint(1_500, 5_000))
        elif kind == "slow_disk":
            self.slow_disks.add(target)
            self.after(self.rng.randint(1_000, 4_000), self.slow_disks.discard, target)
        elif kind == "lost_replies":
            self.controller.lose_replies = True
            self.after(self.rng.randint(1_000, 4_000), setattr, self.controller, "lose_replies", False)
        elif kind == "controller_failover":
            self.controller.failover(self.rng.randint(200, 2_000))
        elif kind == "forge":
            self._forge(target, master)
        else:  # #7689: the master and the controller leader die together
            self._crash(master, self.rng.random() < 0.5, self.rng.randint(500, 3_000))
            self.controller.failover(self.rng.randint(200, 2_000))

    def _forge(self, target: int, master: int) -> None:
        """An attacker on the network (docs/brokers.md): a NOTIFY to `target` naming any master
        at any epoch; a heartbeat for the master saying lease_ms=0 on the attacker's own
        connection, closed soon after (the lease must still hold); an alter from that connection
        with the current epochs (refused: it carries none of the master's heartbeats)."""
        s = self.controller.machine.state.get(NAME)
        epoch = self.rng.choice([(s.master_epoch if s is not None else 0) + 1, 2**31 - 1])
        liar = self.rng.choice(IDS)
        note = m.NotifyBrokerRoleChanged(NAME, f"b{liar}", epoch, epoch, liar, [liar])
        self.after(self.delay(), self.brokers[target].hint, note)
        conn = ("forger", self.events)
        b = self.brokers[master]
        # the master's own connection carries its heartbeats (else, without TLS, the forger's
        # heartbeats make its connection the master's: docs/brokers.md, weak points)
        homed = b.up and self.controller.liveness.table.beats_on(NAME, master, (master, b.incarnation))
        hb = m.BrokerHeartbeat(CLUSTER, f"b{master}", NAME, master, epoch=-1, lease_ms=0)
        self.controller.handle(conn, hb, lambda _: None)
        self.after(self.rng.randint(0, 50), self.controller.connection_closed, conn)
        if s is not None and s.master_id == master:
            alter = m.AlterSyncStateSet(NAME, master, s.master_epoch, [master], s.sync_state_set_epoch)

            def refused(resp: m.Response) -> None:
                if homed and resp.code != ResponseCode.UNAUTHENTICATED:
                    self.violation(f"a forged alter-sync-state-set was answered {resp.code}")

            self.controller.handle(conn, alter, refused)

    def _async_power_loss(self, i: int, tail_ms: int, down_ms: int) -> None:
        """flush=async: the master's page cache is written back, then for `tail_ms` it
        acknowledges what only its slaves' page caches and its own hold; power goes, that tail
        with it, and it restarts after `down_ms`, usually before the controllers count it dead
        (its lease holds it alive). Its slaves hold everything it acknowledged: the election
        after its restart must pick one of them. No other broker fault meanwhile (two faults
        at once may lose what only one copy held: docs/brokers.md), and only while every
        replica is in the SyncStateSet."""
        b, s = self.brokers[i], self.controller.machine.state.get(NAME)
        healthy = s is not None and s.master_id == i and s.sync_state_set == set(IDS)
        if not healthy or not b.up or self.partitions or any(not x.up for x in self.brokers.values()):
            # (a master alone in its SyncStateSet acknowledged records no other copy holds:
            # flush=async loses them with its power, by design)
            self.trace("(skipped: the power loss of a flush=async master is injected on a healthy set)")
            return
        self.quiet_until = self.now + tail_ms + down_ms + ASYNC_POWER_QUIET_MS
        b.disk.sync_all()
        inc = b.incarnation

        def lose() -> None:
            if b.up and b.incarnation == inc:
                b.lost_acked = len(self.acked)
                b.stop(True)
                self.after(down_ms, b.start)

        self.after(tail_ms, lose)

    def _crash(self, i: int, power_loss: bool, down_ms: int) -> None:
        b = self.brokers[i]
        if b.up:
            b.stop(power_loss and self.flush_sync)
            self.after(down_ms, b.start)

    def _cut(self, a: str, b: str, ms: int) -> None:
        """A partition; HA connections across it are reset (TCP would time them out; bytes
        in flight on a connection are never lost while it stays open)."""
        pair = frozenset((a, b))
        self.partitions.add(pair)
        for broker in self.brokers.values():
            for p in list(broker.pipes):
                if frozenset((p.master.address, p.slave.address)) == pair:
                    self.close(p, "partition")
        self.after(ms, self.partitions.discard, pair)

    def _heal_all(self) -> None:
        self.trace("heal everything")
        self.partitions.clear()
        self.slow_disks.clear()
        self.controller.lose_replies = False
        for b in self.brokers.values():
            if not b.up:
                b.start()

    def _final_checks(self) -> None:
        """After the heal: one master, every replica following it with the same log."""
        s = self.controller.machine.state.get(NAME)
        if s is None or s.master_id is None:
            self.violation("no master after the faults healed")
            return
        master = self.brokers[s.master_id]
        if master.replica.role != BrokerRole.MASTER:
            self.violation(f"the controller's master b{master.id} is {master.replica.role.value}")
        for b in self.brokers.values():
            if b is not master and b.log.max_offset != master.log.max_offset:
                self.violation(f"b{b.id} did not catch up with the master b{master.id} "
                               f"({b.log.max_offset} < {master.log.max_offset})")
        self._check_agreement()
        if not self.acked:
            self.violation("nothing was acknowledged in the whole run")


def run_broker_seed(seed: int) -> BrokerSimReport:
    return BrokerSim(seed).run()
