"""One controller's view of broker liveness and master leases (docs/controller.md), sans-I/O.

The service (controller.service) and the simulator (sim.brokers) drive it; time is passed in.

- Heartbeats go into the HeartbeatTable; a master's heartbeat asks for its lease.
- A lease is granted only by a leader sure of its leadership (its own Raft lease holds: no
  other controller can lead before that ends), only to the broker the leader knows as the
  master at the heartbeat's epoch, never while an election of its set is in flight, in doubt
  or an admin's election revokes it, and only if lease + drift fits in the heartbeat timeout
  (what a new leader waits before electing).
- An election whose answer never came (timed out, the term changed, the member stopped: "it
  may still take effect") is in doubt, not over: its entry may still be applied and make
  another broker master. The set stays without leases until a scan reads a state applied at
  or past the index the entry can be at (the leader's last index when the answer was lost;
  once this member leads in a newer term, its last index then: an older term's entry commits
  under a new leader only if that leader's log already holds it).
- A granted lease's end only grows per broker set (so per set, master and epoch): later
  heartbeats, lease_ms=0 or not, and closed connections never shorten it. No election of a
  set that could replace the lease's holder, whoever asks for it, is logged before the set's
  last granted lease + drift has ended (`election_wait`); the table also counts the master
  alive until then (HeartbeatTable.held_until).
- A new leader elects nothing before it has led for one heartbeat timeout (#5712).
- A set needs an election when its master is not alive but a replica is
  (scanInactiveMasterAndTriggerReelect), or when it has no master and a candidate lives;
  after its master restarted, once every live candidate reported since (processor).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from dledger.codes import ControllerResponseCode as RC
from dledger.controller import messages as m
from dledger.controller.config import ControllerConfig
from dledger.controller.elect_policy import LiveInfo, unreported
from dledger.controller.heartbeats import HeartbeatTable
from dledger.controller.machine import BrokerSetBrief


class Liveness:
    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.table = HeartbeatTable(config.broker_heartbeat_timeout_ms, config.broker_lease_drift_ms)
        self._lease_ends: dict[str, int] = {}  # broker set -> when its granted leases surely ended (only grows)
        self._lease_holders: dict[str, int | None] = {}  # broker set -> the master its last lease went to
        self._revoking: dict[str, int] = {}  # broker set -> admin elections revoking its leases
        self._in_doubt: dict[str, tuple[int, int]] = {}  # broker set -> (term, index) of elections in doubt
        self._masters: dict[str, tuple[int | None, int]] = {}  # broker set -> (master id, master epoch)
        self._in_flight: dict[str, int] = {}  # broker set -> elections in flight
        self._reregistered: dict[str, int] = {}  # broker set -> the epoch of a master that registered again
        self._leader_term = -1
        self._leader_since = 0

    def set_config(self, config: ControllerConfig) -> None:
        self.config = config
        self.table.default_timeout_ms = config.broker_heartbeat_timeout_ms
        self.table.lease_drift_ms = config.broker_lease_drift_ms

    # --- heartbeats and leases -----------------------------------------------------------------

    def heartbeat(self, req: m.BrokerHeartbeat, now_ms: int, conn: Hashable | None, leader_sure: bool) -> m.Response:
        if req.broker_id is None:
            return m.Response(int(RC.CONTROLLER_INVALID_REQUEST), "a heartbeat must name its broker id")
        if not self.table.beat(req.cluster_name, req.broker_name, req.broker_id, req.broker_addr, now_ms,
                               timeout_ms=req.heartbeat_timeout_ms, epoch=req.epoch, max_offset=req.max_offset,
                               confirm_offset=req.confirm_offset, priority=req.election_priority, conn=conn,
                               lease_ms=req.lease_ms, view=req.master_epoch):
            return m.Response(int(RC.CONTROLLER_INVALID_REQUEST), "too many live brokers (or replicas of this set)")
        return self._grant(req, now_ms, leader_sure) if req.lease_ms else m.Response()

    def _grant(self, req: m.BrokerHeartbeat, now_ms: int, leader_sure: bool) -> m.Response:
        drift, timeout = self.config.broker_lease_drift_ms, self.config.broker_heartbeat_timeout_ms
        if req.lease_ms + drift > timeout:
            return m.Response(remark=f"lease of {req.lease_ms} ms not granted: lease + drift ({drift} ms) must "
                                     f"be within controller.broker_heartbeat_timeout_ms ({timeout})")
        name = req.broker_name
        if (not leader_sure or name in self._revoking or name in self._in_flight or name in self._in_doubt
                or self._masters.get(name) != (req.broker_id, req.epoch)):
            return m.Response()  # not (or no longer) the master at that epoch: an old master gets no lease
        self._lease_ends[name] = max(self._lease_ends.get(name, 0), now_ms + req.lease_ms + drift)
        self._lease_holders[name] = req.broker_id
        return m.Response(lease_granted=True)

    def revoke(self, name: str, now_ms: int) -> int:
        """Before an admin's election: no more leases in the set; the ms to wait until the last
        one has surely ended."""
        self._revoking[name] = self._revoking.get(name, 0) + 1  # two admins may elect at once
        return self.lease_wait(name, now_ms)

    def lease_wait(self, name: str, now_ms: int) -> int:
        """The ms until every lease this leader granted in the set has surely ended (lease +
        drift after the heartbeat that asked for it arrived); 0: none holds. No election of the
        set may be logged before (a failover of a silent master needs no wait: its heartbeats
        stopped longer ago than its lease)."""
        return max(0, self._lease_ends.get(name, 0) - now_ms)

    def election_wait(self, name: str, live: Mapping[int, LiveInfo], designate: bool, now_ms: int) -> int:
        """The ms to wait before an election with these liveness facts may be logged (0: now).
        While a lease holds, only an election that must keep its holder may go: not an admin's
        (it names another), and only if the facts count the holder alive (the policy keeps a
        live old master)."""
        wait = self.lease_wait(name, now_ms)
        holder = self._lease_holders.get(name)
        if (wait and not designate and holder in live and name not in self._reregistered
                and self._masters.get(name, (None, 0))[0] == holder):
            return 0
        return wait

    def master_registering(self, name: str, broker_id: int) -> None:
        """`broker_id` registers again: if it is the master this leader knows, the set is about
        to lose it (MasterRestartedEvent), and the policy will no longer keep a lease's holder:
        elections wait out the set's leases until a newer epoch is known (a registration
        forged for a live master must not bring a second one while its lease holds)."""
        known = self._masters.get(name)
        if known is not None and known[0] == broker_id:
            self._reregistered[name] = known[1]

    def end_revoke(self, name: str) -> None:
        """One admin's election is over (leases resume once every revoke ended, and no election
        of the set is in flight or in doubt)."""
        left = self._revoking.pop(name, 1) - 1
        if left:
            self._revoking[name] = left

    # --- the leader's view of masters --------------------------------------------------------

    def election_started(self, name: str) -> None:
        self._in_flight[name] = self._in_flight.get(name, 0) + 1

    def election_ended(self, name: str, resp: m.Response | None, doubt: tuple[int, int] | None = None) -> None:
        """`doubt`: no answer came and the entry may still be applied: (the term it was proposed
        in, the leader's last index when the answer was lost, at or past the entry's index if
        it was stored)."""
        if resp is not None and resp.master_epoch is not None:
            self.note_master(name, resp.master_broker_id, resp.master_epoch)
        if resp is None and doubt is not None:
            old = self._in_doubt.get(name)
            self._in_doubt[name] = doubt if old is None else (max(old[0], doubt[0]), max(old[1], doubt[1]))
        left = self._in_flight.pop(name, 1) - 1
        if left:
            self._in_flight[name] = left

    def in_doubt(self, name: str) -> bool:
        return name in self._in_doubt

    def settle(self, term: int, applied_index: int | None, last_index: int | None) -> None:
        """A scan leading at `term` read the state applied at `applied_index` or later (None:
        unknown) while its log ended at `last_index`: the elections in doubt that state shows
        are settled (the scan's masters are then the truth). One proposed in an older term may
        still commit under this leader only at or before its last index now."""
        for name, (t, index) in list(self._in_doubt.items()):
            if t != term and last_index is not None:
                t, index = term, max(index, last_index)
                self._in_doubt[name] = (t, index)
            if t == term and applied_index is not None and applied_index >= index:
                del self._in_doubt[name]

    def note_master(self, name: str, master_id: int | None, epoch: int) -> None:
        """Only newer epochs replace what is known (a scan's copy may be older than an
        election's answer)."""
        old = self._masters.get(name)
        if old is None or epoch >= old[1]:
            self._masters[name] = (master_id, epoch)
        if self._reregistered.get(name, epoch) < epoch:
            del self._reregistered[name]

    def keep_only(self, names: set[str]) -> None:
        """Forget the masters of sets the state no longer holds (an admin cleaned a live set:
        its old master must get no lease any more)."""
        for name in [n for n in self._masters if n not in names]:
            del self._masters[name]
        for name in [n for n in self._reregistered if n not in names]:
            del self._reregistered[name]

    # --- scans -------------------------------------------------------------------------------

    def leading(self, term: int | None, now_ms: int) -> bool:
        """Called at every scan with the leader's term (None: not leader). True once elections
        may run: the leader has led for one heartbeat timeout."""
        if term is None:
            self._leader_term = -1
            self._masters.clear()
            return False
        if term != self._leader_term:
            self._leader_term, self._leader_since = term, now_ms
        return self.may_elect(term, now_ms)

    def may_elect(self, term: int, now_ms: int) -> bool:
        """The leader at `term` has led (as the scans saw) for one heartbeat timeout, the
        longest of any broker's and the configured one (as of now)."""
        wait = max(self.table.max_timeout_ms, self.config.broker_heartbeat_timeout_ms)
        return term == self._leader_term and now_ms >= self._leader_since + wait

    def needs_election(self, s: BrokerSetBrief, now_ms: int) -> bool:
        if self.lease_wait(s.name, now_ms):
            return False  # a master may still acknowledge: no other one yet, whatever the table says
        live = self.table.live_infos(s.name, now_ms)
        if s.master_id is not None:  # a dead master while a replica lives
            return s.master_id not in live and bool(live)
        # no master after a failed election: retry once a candidate lives (upstream waited for a broker)
        in_sync = [i for i in s.sync_state_set if i in live]
        candidates = in_sync or ([i for i in s.replicas if i in live] if self.config.enable_elect_unclean_master
                                 else [])
        if s.fresh_epoch and unreported(candidates, live, s.fresh_epoch):
            return False  # the master restarted: not before every candidate reported since (processor)
        return s.master_epoch > 0 and bool(candidates)
