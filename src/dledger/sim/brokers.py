"""Controllers and a broker set under seeded faults, in simulated time (docs/brokers.md).

`python -m dledger.sim --brokers --seeds N`. One broker set of three replicas: each a
ReplicaState (roles, lease, confirm offset) over a BrokerLog on a SimDiskStore (durable only
once "fsynced"), with the sans-I/O HA pieces talking over simulated FIFO connections. The
controller group is one linearizable state machine (ControllerStateMachine's `process`) with
the service's Liveness (heartbeats, lease grants, the new leader's grace, which sets need an
election); a controller leader failover stops grants at once (the old leader's Raft lease)
and brings a new leader after a gap. Brokers use flush=sync semantics and all-ack: a send is
acknowledged once on every SyncStateSet member's disk and while the master's lease holds.

Faults by seed: broker kills (the page cache survives) and power losses (it does not),
partitions between a broker and the controllers (a master cut off from them but not from its
slaves) or between brokers, slow disks, lost controller replies, controller leader failovers,
and forgeries (docs/brokers.md): a NOTIFY naming any master and epoch up to 2**31-1 (a broker
takes it as a hint and asks the controller), a heartbeat for the master with lease_ms=0 on a
connection that then closes (the lease still holds), an alter-sync-state-set on a connection
that carries no heartbeats of the master (refused).

Invariants, after every event:
- at most one broker holds a valid master lease at any moment, so at most one acknowledges;
- every acknowledged record is, byte for byte, on every member of the controller's
  SyncStateSet (all-ack);
- a replica's confirm offset never goes back while it runs;
- running replicas agree byte for byte up to the lesser of their confirm offsets.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from dledger.broker.epoch_file import EpochFileCache
from dledger.broker.ha_master import HAConfig, HAProtocolError
from dledger.broker.ha_packets import PacketError
from dledger.broker.ha_service import AckSettings, MasterHA
from dledger.broker.ha_slave import SlaveClient
from dledger.broker.log import BrokerLog
from dledger.broker.replica import Change, ReplicaState, Role
from dledger.codes import ControllerResponseCode as RC
from dledger.codes import DLedgerError, ResponseCode
from dledger.controller import messages as m
from dledger.controller.config import ControllerConfig
from dledger.controller.elect_policy import LiveInfo
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
CONTROLLER = ControllerConfig(broker_heartbeat_timeout_ms=1_500, broker_lease_drift_ms=200)


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
class Waiter:
    next_offset: int
    start: int
    deadline: int
    ha: MasterHA


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
    def __init__(self, sim: BrokerSim, broker_id: int) -> None:
        self.sim, self.id = sim, broker_id
        self.incarnation = 0
        self.disk = Cut()
        self.disk.on_request = lambda: sim.after(sim.fsync_ms(self.id), self._flushed, self.incarnation)
        self.log = BrokerLog(self.disk)
        self.epochs = EpochFileCache()  # written through (temp + rename): it survives any crash
        self.up = False
        self.incarnation = 0
        self.saved_confirm = -1
        self.replica = self._fresh()
        self.pipes: list[Pipe] = []
        self.waiters: list[Waiter] = []
        self.altering = False
        self.registered = False
        self.last_confirm = -1
        self.querying: object | None = None  # the replica-info query in flight for hints (one at a time)
        self.hinted_again = False

    def _fresh(self) -> ReplicaState:
        r = ReplicaState(NAME, self.log, self.epochs, HA, ACKS, LEASE_MS, ack_durable=True,
                         confirm_offset=self.saved_confirm)
        r.broker_id = self.id
        self.altering = False
        return r

    @property
    def address(self) -> str:
        return f"b{self.id}"

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self.up:
            return  # the heal restarted it before its own restart came
        self.up, self.incarnation = True, self.incarnation + 1
        self.replica = self._fresh()
        self.last_confirm = self.replica.confirm_offset
        self.sim.trace(f"b{self.id} up (log {self.log.max_offset}, epochs {self.epochs.entries})")
        self.registered = False
        self.querying, self.hinted_again = None, False
        self._register(self.incarnation)
        self._tick(self.incarnation)

    def _register(self, inc: int) -> None:
        """Until the controller answers (as the server's startup loop)."""
        if self.up and inc == self.incarnation and not self.registered:
            self.sim.call_controller(self, m.RegisterBroker(CLUSTER, NAME, self.id, self.address), self._registered)
            self.sim.after(500, self._register, inc)

    def stop(self, power_loss: bool) -> None:
        self.up = False
        self.waiters.clear()
        for p in list(self.pipes):
            self.sim.close(p, "crash")
        if power_loss:
            self.disk.crash()
        else:
            self.disk.sync_all()  # a killed process: the page cache survives and reaches the disk
        self.sim.controller.connection_closed((self.id, self.incarnation))
        self.sim.trace(f"b{self.id} {'power loss' if power_loss else 'killed'} (log {self.log.max_offset})")

    def _registered(self, resp: m.Response) -> None:
        if resp.code != RC.SUCCESS or self.registered:
            return
        self.registered = True
        if resp.master_broker_id is not None and resp.master_address and resp.master_epoch is not None:
            self.change_role(resp)
        else:
            self.sim.call_controller(self, m.ElectMaster(CLUSTER, NAME, self.id), self._elect_answer)

    def _elect_answer(self, resp: m.Response) -> None:
        if resp.code in (RC.SUCCESS, RC.CONTROLLER_MASTER_STILL_EXIST):
            self.change_role(resp)

    # --- roles -----------------------------------------------------------------------------

    def hint(self, note: m.NotifyBrokerRoleChanged | None = None) -> None:
        """A NOTIFY (the controller's or a forged one) or the poll: ask the controller leader
        for replica info, one query in flight (as the server's _follow_controller); a note's
        own fields are never used."""
        if not self.up or not self.registered:
            return
        if self.querying is not None:
            self.hinted_again = True
            return
        token = self.querying = object()

        def done(resp: m.Response | None) -> None:
            if self.querying is not token:
                return
            self.querying = None
            if resp is not None:
                self._replica_info(resp)
            if self.hinted_again:
                self.hinted_again = False
                self.hint()

        self.sim.call_controller(self, m.GetReplicaInfo(NAME), done)
        self.sim.after(3_000, done, None)  # the request's timeout

    def change_role(self, resp: m.Response) -> None:
        """Take the role a controller answer names (register, election, replica info)."""
        if not self.up or resp.master_broker_id is None or not resp.master_address:
            return
        epoch = resp.master_epoch or 0
        change = self.replica.change_role(resp.master_broker_id, resp.master_address, epoch,
                                          resp.sync_state_set_epoch or 0, set(resp.sync_state_set or ()),
                                          self.address)
        if change == Change.NONE:
            self.settle()
            return
        self.sim.trace(f"b{self.id} {change.name} at epoch {epoch}")
        for p in list(self.pipes):
            self.sim.close(p, "role change")
        self.waiters.clear()
        if change == Change.MASTER:
            self.heartbeat()

    def _tick(self, inc: int) -> None:
        """Every 100 ms: HA timers, connects, waiters; heartbeats, polls and checks on their periods."""
        if not self.up or inc != self.incarnation:
            return
        now = self.sim.now
        r = self.replica
        if now % HEARTBEAT_MS < 100:
            self.heartbeat()
        if now % 1000 < 100 and self.registered:
            self.saved_confirm = r.confirm_offset
            self.hint()
            if r.master_ha is not None:
                r.master_ha.shrink(now)
                self.alter()
        if r.slave is not None:
            self._slave_tick(now)
        if r.master_ha is not None:
            for p in list(self.pipes):
                if (conn := r.master_ha.connections.get(p.key)) is not None and conn.expired(now):
                    self.sim.close(p, "housekeeping")
            self.pump()
        self.settle()
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

    def _replica_info(self, resp: m.Response) -> None:
        if resp.code != RC.SUCCESS or resp.master_epoch is None:
            return
        if resp.master_epoch == self.replica.master_epoch:
            self.replica.sync_state_set_read(resp.master_epoch, set(resp.sync_state_set or ()),
                                             resp.sync_state_set_epoch or 0)
            self.settle()
            self.alter()
            return
        if resp.master_epoch > self.replica.master_epoch and resp.master_broker_id is None:
            self.sim.call_controller(self, m.ElectMaster(CLUSTER, NAME, self.id), self._elect_answer)
        elif resp.master_broker_id is not None:
            self.change_role(resp)

    def heartbeat(self) -> None:
        r = self.replica
        sent, epoch = self.sim.now, r.master_epoch
        hb = m.BrokerHeartbeat(CLUSTER, self.address, NAME, self.id, self.epochs.last_epoch, self.log.max_offset,
                               r.confirm_offset, lease_ms=r.heartbeat_lease_ms)

        def granted(resp: m.Response) -> None:
            if resp.lease_granted and self.up:
                r.lease_granted(sent, epoch)
                self.settle()

        self.sim.call_controller(self, hb, granted)

    def alter(self, proposal: frozenset[int] | None = None) -> None:
        """Send the next wanted SyncStateSet change, one at a time (as the server's alter loop)."""
        if self.altering:
            return
        r = self.replica
        req = r.next_alter()
        if req is None:
            return
        self.altering = True
        self.sim.trace(f"b{self.id} proposes {req.sync_state_set} (set epoch {req.sync_state_set_epoch})")
        answered = {"done": False}

        def answer(resp: m.Response | None) -> None:
            if answered["done"] or r is not self.replica or not self.up:
                return
            answered["done"] = True
            self.altering = False
            self.sim.trace(f"b{self.id} proposal {req.sync_state_set}: "
                           f"{'no answer' if resp is None else (resp.code, resp.sync_state_set)}")
            if resp is not None and resp.code == ResponseCode.UNAUTHENTICATED:
                resp = None  # not over our heartbeats' connection: sent again (as the server)
            r.alter_answered(req, resp)
            if r.unresolved:
                self.sim.call_controller(self, m.GetReplicaInfo(NAME), self._replica_info)
            self.settle()
            self.sim.after(100 if resp is None or r.unresolved else 0, self.alter)

        self.sim.call_controller(self, req, answer)
        self.sim.after(3_000, answer, None)  # the request's timeout

    # --- sends and acks ----------------------------------------------------------------------

    def send(self, bodies: list[bytes]) -> None:
        r, now = self.replica, self.sim.now
        if not self.up or r.send_refusal(now) is not None:
            return
        ha = r.master_ha
        assert ha is not None
        start = self.log.max_offset
        try:
            r.append(bodies)
        except DLedgerError:
            return
        self.waiters.append(Waiter(self.log.max_offset, start, now + SLAVE_TIMEOUT_MS, ha))
        self.disk.request_flush()
        self.pump()
        self.settle()

    def settle(self) -> None:
        """Acknowledge the sends that are on every copy they need, while the lease holds."""
        if not self.up:
            return
        r, now = self.replica, self.sim.now
        if r.master_ha is not None:
            r.master_ha.recompute_confirm()
        self.sim.check_confirm(self)
        while self.waiters:
            w = self.waiters[0]
            if w.ha is not r.master_ha or w.deadline <= now:
                self.waiters.pop(0)
                continue
            if not (r.acked(w.next_offset) and self.log.durable_offset >= w.next_offset and r.lease_valid(now)):
                return
            self.waiters.pop(0)
            self.sim.acknowledge(Acked(w.start, w.next_offset, self.disk.bytes_at(w.start, w.next_offset), self.id,
                                       r.master_epoch, now))

    def _flushed(self, inc: int) -> None:
        if inc != self.incarnation or not self.up:
            return
        self.disk.complete_flush()
        if self.replica.slave is not None:
            pipe = next((p for p in self.pipes if p.client is self.replica.slave), None)
            if pipe is not None:
                self.sim.send_up(pipe, self.replica.slave.ack_if_grew(self.sim.now))
        self.settle()

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
    """The controller group as one linearizable state machine, with a leader's Liveness."""

    def __init__(self, sim: BrokerSim) -> None:
        self.sim = sim
        self.machine = ControllerStateMachine()
        self.liveness = Liveness(CONTROLLER)
        self.term = 1
        self.available = True
        self.lose_replies = False
        for i in IDS:  # ids applied for and accepted before the run (registration is tested apart)
            self._apply(m.ApplyBrokerId(CLUSTER, NAME, i, f"b{i};0"))

    def _apply(self, req: m.WriteRequest | m.ReadRequest, live: dict[int, LiveInfo] | None = None) -> m.Response:
        now = self.sim.now
        cmd = m.Command(req, {NAME: self.liveness.table.live_infos(NAME, now) if live is None else live})
        resp, events = process(self.machine.state, cmd)
        for ev in events:
            self.machine.state.apply(ev)
        return resp

    def handle(self, conn: Hashable, req: m.Request, answer: Callable[[m.Response], None]) -> None:
        """A request on connection `conn` (a broker incarnation's, or a forger's); `answer` is
        called with the answer, now or (an election waiting out a lease) later, or never."""
        now = self.sim.now
        if isinstance(req, m.BrokerHeartbeat):
            answer(self.liveness.heartbeat(req, now, conn, self.available))
            return
        if not self.available:
            return
        assert isinstance(req, m.WriteRequest | m.ReadRequest)
        if isinstance(req, m.AlterSyncStateSet) and not self.liveness.table.beats_on(NAME, req.master_broker_id, conn):
            answer(m.Response(int(ResponseCode.UNAUTHENTICATED), "not over the master's heartbeat connection"))
            return
        if not isinstance(req, m.ElectMaster):
            answer(self._apply(req))
            return
        self.elect(req, answer)

    def elect(self, req: m.ElectMaster, answer: Callable[[m.Response], None] = lambda _: None) -> None:
        """As the service's _elect: logged only once no lease it granted can still hold a
        master this election could replace."""
        now = self.sim.now
        live = self.liveness.table.live_infos(NAME, now)
        wait = self.liveness.election_wait(NAME, live, req.designate_elect, now)
        if wait:
            self.sim.trace(f"election waits {wait} ms for the master's lease")
            term = self.term

            def again() -> None:
                if self.available and self.term == term:
                    self.elect(req, answer)

            self.sim.after(wait, again)
            return
        self.liveness.election_started(NAME)
        resp = self._apply(req, live)
        self.liveness.election_ended(NAME, resp)
        if resp.code == RC.SUCCESS:
            self.sim.trace(f"controller elected b{resp.master_broker_id} at epoch {resp.master_epoch}")
            note = m.NotifyBrokerRoleChanged(NAME, f"b{resp.master_broker_id}", resp.master_epoch or 0,
                                             resp.sync_state_set_epoch or 0, resp.master_broker_id,
                                             resp.sync_state_set or [])
            for b in self.sim.brokers.values():
                if b.up and not self.sim.blocked(CTL, b.address):
                    self.sim.after(self.sim.rng.randint(1, 20), b.hint, note)
        answer(resp)

    def connection_closed(self, conn: Hashable) -> None:
        self.liveness.table.connection_closed(conn, self.sim.now)

    def scan(self) -> None:
        now = self.sim.now
        self.liveness.table.expire(now)
        if self.available:
            s = self.machine.brief()[0]
            self.liveness.note_master(s.name, s.master_id, s.master_epoch)
            if self.liveness.leading(self.term, now) and self.liveness.needs_election(s, now):
                self.elect(m.ElectMaster(broker_name=NAME))
        self.sim.after(250, lambda: self.scan())

    def failover(self, gap_ms: int) -> None:
        """The leader is lost: no grants at once (its Raft lease ended before anyone else
        leads), a new leader after `gap_ms` with the heartbeats it saw as a follower."""
        self.available = False
        self.liveness.leading(None, self.sim.now)
        self.sim.trace(f"controller leader lost for {gap_ms} ms")

        def back() -> None:
            self.term += 1
            table = self.liveness.table
            self.liveness = Liveness(CONTROLLER)
            self.liveness.table = table
            self.available = True
            self.sim.trace(f"controller leader at term {self.term}")

        self.sim.after(gap_ms, back)


@dataclass
class BrokerSimReport:
    seed: int
    ok: bool = True
    acked: int = 0
    faults: int = 0
    elections: int = 0
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"seed {self.seed}: {'ok' if self.ok else 'FAILED'}, {self.acked} acknowledged sends, "
                f"{self.faults} faults, {self.elections} elections")


class BrokerSim:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        self._queue: list[tuple[int, int, Callable[..., None], tuple[object, ...]]] = []
        self._seq = itertools.count()
        self.partitions: set[frozenset[str]] = set()
        self.slow_disks: set[int] = set()
        self.controller = SimControllerGroup(self)
        self.brokers = {i: Broker(self, i) for i in IDS}
        self.acked: list[Acked] = []
        self.verified: dict[int, tuple[int, int]] = {}  # broker -> (cuts seen, acked records verified)
        self.report = BrokerSimReport(seed)
        self.events = 0

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
            p.master.alter(proposal)

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
        if p.client.truncated_at is not None:
            p.slave.replica.sync_slave_truncation()
        p.slave.disk.request_flush()
        self.send_up(p, out)
        self.check_confirm(p.slave)

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
            p.master.alter(proposal)
        p.master.pump()
        p.master.settle()

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
        if kind in ("kill", "power"):
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

    def _crash(self, i: int, power_loss: bool, down_ms: int) -> None:
        b = self.brokers[i]
        if b.up:
            b.stop(power_loss)
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
        if master.replica.role != Role.MASTER:
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
