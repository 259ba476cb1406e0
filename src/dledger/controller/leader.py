"""The controller leader's decisions, sans-I/O (docs/controller.md; upstream's ControllerManager).

`ControllerLeader` decides what the active controller does; `ControllerService` (real time,
sockets, the Raft group) and the broker simulator (sim.brokers, simulated time) drive the
same object, so the simulator's invariants check the shipped rules. Time is passed in, and
every output is a value:

- `command(req, now)`: the log entry a request becomes: the request with the leader's
  liveness facts for its broker sets (so every controller validates it the same way).
- `election_step(req, now, deadline)`: whether an election may be logged now (`Propose`,
  with its command), must wait out a master lease first (`Wait`), or cannot before the
  deadline (`Refuse`). No election of a set that could replace a lease's holder is logged
  before that lease + drift has ended (docs/brokers.md, "The master lease").
- `election_ended(name, resp, now, doubt)`: the pushes to send (`Notify`): the set's live replicas
  are told of the new master (NOTIFY_BROKER_ROLE_CHANGED, a hint: brokers also poll); a push
  to an address is not repeated for an epoch no newer than the one in flight there. An
  election whose answer was lost (`doubt`) may still take effect: its set gets no lease
  until a scan's state shows the index its entry can be at applied.
- `tick(now, term, briefs, applied_index, last_index)`: the scan (scanInactiveMasterAndTriggerReelect): the broker sets
  whose master died while a replica lives (#5009/#6382), or that have no master and a live
  candidate. Nothing is elected before the leader has led for one heartbeat timeout (#5712:
  a new leader that has not heard every broker yet would see them all dead), and no set is
  elected for twice at once.
- heartbeats, lease grants and the alter rule (an alter comes over the master's own
  heartbeat connection) go through `Liveness` and its `HeartbeatTable`.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from dledger.codes import ControllerResponseCode as RC
from dledger.controller import messages as m
from dledger.controller.config import ControllerConfig
from dledger.controller.heartbeats import HeartbeatTable, Key
from dledger.controller.liveness import Liveness
from dledger.controller.machine import BrokerSetBrief

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Propose:
    """Log this command now (the election is counted in flight until `election_ended`)."""

    command: m.Command


@dataclass(frozen=True)
class Wait:
    """Ask again in `ms`: a lease this leader granted may still hold a master the election could replace."""

    ms: int


@dataclass(frozen=True)
class Refuse:
    """Answer `response`: the election cannot be logged before the request's deadline."""

    response: m.Response


ElectionStep = Propose | Wait | Refuse


@dataclass(frozen=True)
class Notify:
    """Push `note` to broker `broker_id` of the set at `address` (where it takes requests);
    call `notify_done(address, note.master_epoch)` once the push is over, however it ended."""

    broker_id: int
    address: str
    note: m.NotifyBrokerRoleChanged


class ControllerLeader:
    """One controller's leader-side state: liveness and leases, elections in flight, pushes in flight."""

    def __init__(self, config: ControllerConfig, table: HeartbeatTable | None = None) -> None:
        """`table`: the heartbeats seen so far (a controller that becomes leader keeps what it
        heard as a follower; every controller takes every broker's heartbeats)."""
        self.liveness = Liveness(config)
        if table is not None:
            self.liveness.table = table
        self._leader_term = -1  # the term the scans last saw this member lead in
        self._electing: set[str] = set()  # broker sets a scan is electing for
        self._pushing: dict[str, int] = {}  # address -> the master epoch of the push in flight there
        self.elections = 0  # scan-triggered elections won (tests, status)

    @property
    def config(self) -> ControllerConfig:
        return self.liveness.config

    def set_config(self, config: ControllerConfig) -> None:
        self.liveness.set_config(config)

    @property
    def table(self) -> HeartbeatTable:
        return self.liveness.table

    # --- requests ----------------------------------------------------------------------------

    def heartbeat(self, req: m.BrokerHeartbeat, now_ms: int, conn: Hashable | None, leader_sure: bool) -> m.Response:
        """`leader_sure`: this member leads and its Raft lease holds (no other controller can
        lead before it ends): only then is a master lease granted."""
        return self.liveness.heartbeat(req, now_ms, conn, leader_sure)

    def alter_refusal(self, req: m.AlterSyncStateSet, conn: Hashable) -> str | None:
        """Only the master alters its SyncStateSet, over the connection its own heartbeats
        come on (the processor checks that the id is the current master's, and its certificate)."""
        if self.table.beats_on(req.broker_name, req.master_broker_id, conn):
            return None
        return (f"CONTROLLER_ALTER_SYNC_STATE_SET for {req.broker_name} must come over the connection broker "
                f"{req.master_broker_id}'s heartbeats arrive on (the master's own); this one carries none of them")

    def command(self, req: m.WriteRequest | m.ReadRequest, now_ms: int, principal: str = "") -> m.Command:
        """The log entry (or query) a request that is not an election becomes. `principal`:
        the sender's certificate name ("": none)."""
        if isinstance(req, m.GetSyncStateData):
            names = self.table.names() if req.all_sets else req.broker_names
        else:
            names = [getattr(req, "broker_name", "")]
        if isinstance(req, m.RegisterBroker):
            self.liveness.master_registering(req.broker_name, req.broker_id)
        return m.Command(req, {n: self.table.live_infos(n, now_ms) for n in names},
                         self.config.enable_elect_unclean_master, principal)

    def connection_closed(self, conn: Hashable, now_ms: int) -> list[Key]:
        """The brokers a closed connection took away (the scan should look again soon if any)."""
        return self.table.connection_closed(conn, now_ms)

    # --- elections ---------------------------------------------------------------------------

    def revoke(self, name: str, now_ms: int) -> int:
        """Before an admin's election: no more leases in the set until `end_revoke`."""
        return self.liveness.revoke(name, now_ms)

    def end_revoke(self, name: str) -> None:
        self.liveness.end_revoke(name)

    def election_step(self, req: m.ElectMaster, now_ms: int, deadline_ms: int | None = None,
                      principal: str = "") -> ElectionStep:
        """An election of any kind: `Propose` once no lease granted in the set can still hold a
        master the election could replace (then no lease is granted in the set until
        `election_ended`), else `Wait`, or `Refuse` if that wait ends after `deadline_ms`."""
        name = req.broker_name
        live = self.table.live_infos(name, now_ms)
        wait = self.liveness.election_wait(name, live, req.designate_elect, now_ms)
        if wait:
            if deadline_ms is not None and now_ms + wait > deadline_ms:
                return Refuse(m.Response(int(RC.CONTROLLER_ELECT_MASTER_FAILED), f"broker set {name}: the master's "
                                         f"lease still holds for {wait} ms: no election before it ends"))
            return Wait(wait)
        self.liveness.election_started(name)
        return Propose(m.Command(req, {name: live}, self.config.enable_elect_unclean_master, principal))

    def election_ended(self, name: str, resp: m.Response | None, now_ms: int,
                       doubt: tuple[int, int] | None = None) -> list[Notify]:
        """A proposed election's answer (None: none came); the pushes its success calls for.
        `doubt`, with no answer: the entry may still be applied (timed out, the term changed):
        (the term it was proposed in, the leader's last log index when the answer was lost);
        the set then gets no lease until a scan settles it. None with no answer: the entry was
        surely not stored (refused before the append)."""
        self.liveness.election_ended(name, resp, doubt)
        if resp is None or resp.code != RC.SUCCESS:
            return []
        return self._notifications(name, resp, now_ms)

    def _notifications(self, name: str, resp: m.Response, now_ms: int) -> list[Notify]:
        """The set's live replicas, each told once per newer master epoch."""
        epoch = resp.master_epoch
        if not self.config.notify_broker_role_changed or epoch is None:
            return []
        note = m.NotifyBrokerRoleChanged(name, resp.master_address, epoch, resp.sync_state_set_epoch or 0,
                                         resp.master_broker_id, resp.sync_state_set or [])
        out = []
        for broker_id, registered in (resp.broker_addrs or {}).items():
            if not self.table.alive(name, broker_id, now_ms):
                continue
            address = m.client_address(registered)
            if self._pushing.get(address, -1) >= epoch:
                continue  # a push of this epoch or a newer one is on its way there
            self._pushing[address] = epoch
            out.append(Notify(broker_id, address, note))
        return out

    def notify_done(self, address: str, epoch: int) -> None:
        """The push of `epoch` to `address` is over (sent, failed or superseded)."""
        if self._pushing.get(address) == epoch:
            del self._pushing[address]

    # --- the scan ----------------------------------------------------------------------------

    def may_elect(self, term: int, now_ms: int) -> bool:
        """The leader at `term` has led, as the scans saw, for one heartbeat timeout."""
        return self.liveness.may_elect(term, now_ms)

    def tick(self, now_ms: int, term: int | None, briefs: Iterable[BrokerSetBrief] = (),
             applied_index: int | None = None, last_index: int | None = None) -> list[m.ElectMaster]:
        """A scan: `term` is the term this member leads in (None: it does not lead), `briefs`
        every broker set of the applied state (read while leading), a state applied at least
        up to `applied_index` (None: unknown), read while the log ended at `last_index`. The
        elections to run, one per set at a time: report each one's end with
        `scan_election_done`. Elections in doubt stay so while this member does not lead."""
        self.table.expire(now_ms)
        if term is None:
            self.liveness.leading(None, now_ms)
            return []
        if term != self._leader_term:
            self._leader_term = term
            log.info("controller leader at term %d: elections wait one heartbeat timeout", term)
        may_elect = self.liveness.leading(term, now_ms)  # #5712: not before one heartbeat timeout
        sets = list(briefs)
        self.liveness.keep_only({s.name for s in sets})
        for s in sets:
            self.liveness.note_master(s.name, s.master_id, s.master_epoch)
        self.liveness.settle(term, applied_index, last_index)
        if not may_elect:
            return []
        out = []
        for s in sets:
            if s.name not in self._electing and self.liveness.needs_election(s, now_ms):
                self._electing.add(s.name)
                out.append(m.ElectMaster(broker_name=s.name))
        return out

    def scan_election_done(self, name: str, resp: m.Response | None) -> None:
        """A scan's election of `name` is over (`resp`: its last answer, None if none came);
        the next scan may elect for the set again."""
        self._electing.discard(name)
        if resp is not None and resp.code == RC.SUCCESS:
            self.elections += 1
            log.warning("broker set %s: elected master %s (epoch %s)", name, resp.master_broker_id,
                        resp.master_epoch)
