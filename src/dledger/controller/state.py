"""The controller's replicated state (upstream's ReplicasInfoManager: BrokerReplicaInfo,
SyncStateInfo) and the events that change it.

For every broker set (a broker name): its registered replicas (id -> address, register check
code), the next id to hand out, the master, the master epoch, the SyncStateSet and its epoch.
Events are what applying a logged request makes (controller.processor), applied in log order
on every controller; `apply` is a pure function of the state and the event, so every
controller holds the same state at the same index. Liveness is never part of it (heartbeats
are not logged: the leader writes the liveness facts a request needs into its log entry).

Upstream quirks kept on purpose: `next_assign_id` is 1 + the number of ids ever
added (not max id + 1); a failed election (`ElectMasterEvent(elected=False)`) bumps the master
epoch and keeps the SyncStateSet; cleaning an id does not bump an epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec


class ApplyBrokerIdEvent(msgspec.Struct, frozen=True):
    cluster: str
    broker: str
    address: str
    broker_id: int
    check_code: str
    principal: str = ""  # the applicant's certificate name: the id is bound to it ("": unbound)


class ElectMasterEvent(msgspec.Struct, frozen=True):
    broker: str
    elected: bool
    master_id: int = -1  # when elected


class AlterSyncStateSetEvent(msgspec.Struct, frozen=True):
    broker: str
    sync_state_set: frozenset[int]


class CleanBrokerDataEvent(msgspec.Struct, frozen=True):
    broker: str
    ids: frozenset[int] | None = None  # None or empty: the whole broker set


class MasterRestartedEvent(msgspec.Struct, frozen=True):
    """Ours: the master registered again (it restarted, and with flush=async may have lost an
    unflushed tail that a slave holds and that was acknowledged). The set loses its master
    and its epoch moves on, the SyncStateSet kept (as a failed election); the next election
    ranks the SyncStateSet by facts reported at or past that epoch only (`fresh_epoch`), so
    the replica holding the most is chosen, not the restarted one by its report from before
    the restart. An epoch is never continued after a restart (#7689)."""

    broker: str


class BindPrincipalEvent(msgspec.Struct, frozen=True):
    """Ours: an id registered before bindings existed (or without TLS), registering again with
    a certificate, is bound to that certificate's name from now on."""

    broker: str
    broker_id: int
    principal: str


class UpdateBrokerAddressEvent(msgspec.Struct, frozen=True):
    cluster: str
    broker: str
    broker_id: int
    address: str


Event = (ApplyBrokerIdEvent | ElectMasterEvent | AlterSyncStateSetEvent | CleanBrokerDataEvent
         | UpdateBrokerAddressEvent | MasterRestartedEvent | BindPrincipalEvent)

@dataclass
class Replica:
    address: str
    check_code: str
    principal: str = ""  # the certificate name bound to this id ("": none, docs/controller.md)


@dataclass
class BrokerSet:
    """One broker name's replicas and its SyncStateInfo, as one record."""

    cluster: str
    name: str
    next_assign_id: int = 1
    replicas: dict[int, Replica] = field(default_factory=dict)
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set: set[int] = field(default_factory=set)
    sync_state_set_epoch: int = 0
    fresh_epoch: int = 0  # after a master restart: elections rank facts reported at or past it (0: any)

    @property
    def master_address(self) -> str | None:
        r = self.replicas.get(self.master_id) if self.master_id is not None else None
        return r.address if r is not None else None

    @property
    def first_election(self) -> bool:
        return self.master_epoch == 0

    def add_replica(self, broker_id: int, address: str, check_code: str, principal: str = "") -> None:
        self.replicas[broker_id] = Replica(address, check_code, principal)
        self.next_assign_id += 1  # upstream: 1 + ids ever added, whatever the id

    def principal_of(self, broker_id: int | None) -> str:
        """The certificate name bound to `broker_id` ("": none, or no such replica)."""
        r = self.replicas.get(broker_id) if broker_id is not None else None
        return r.principal if r is not None else ""

    @property
    def principals(self) -> dict[int, str]:
        """Every bound id of the set and its certificate name (what replica info carries)."""
        return {i: r.principal for i, r in sorted(self.replicas.items()) if r.principal}

    def set_master(self, broker_id: int | None) -> None:
        self.master_id = broker_id
        self.master_epoch += 1

    def set_sync_state_set(self, ids: set[int] | frozenset[int]) -> None:
        self.sync_state_set = set(ids)
        self.sync_state_set_epoch += 1


class ControllerState:
    """Every broker set the controller knows; changed only by `apply`."""

    def __init__(self) -> None:
        self.sets: dict[str, BrokerSet] = {}

    def get(self, broker: str) -> BrokerSet | None:
        return self.sets.get(broker)

    def next_broker_id(self, broker: str) -> int:
        s = self.sets.get(broker)
        return s.next_assign_id if s is not None else 1

    def apply(self, event: Event) -> None:
        """One event, in log order (an event about an unknown broker set changes nothing)."""
        if isinstance(event, ApplyBrokerIdEvent):
            s = self.sets.get(event.broker)
            if s is None:
                s = self.sets[event.broker] = BrokerSet(event.cluster, event.broker)
            if event.broker_id not in s.replicas:  # a retried apply adds nothing
                s.add_replica(event.broker_id, event.address, event.check_code, event.principal)
            return
        s = self.sets.get(event.broker)
        if s is None:
            return
        if isinstance(event, ElectMasterEvent):
            if event.elected:
                s.set_master(event.master_id)
                s.set_sync_state_set({event.master_id})
                s.fresh_epoch = 0
            else:
                s.set_master(None)  # no candidate: the epoch moves, the SyncStateSet stays
        elif isinstance(event, AlterSyncStateSetEvent):
            s.set_sync_state_set(event.sync_state_set)
        elif isinstance(event, MasterRestartedEvent):
            s.set_master(None)
            s.fresh_epoch = s.master_epoch
        elif isinstance(event, CleanBrokerDataEvent):
            self._clean(s, event.ids)
        elif isinstance(event, UpdateBrokerAddressEvent):
            r = s.replicas.get(event.broker_id)
            if r is not None:
                r.address = event.address
        elif isinstance(event, BindPrincipalEvent):
            r = s.replicas.get(event.broker_id)
            if r is not None and not r.principal:  # a binding is never replaced
                r.principal = event.principal

    def _clean(self, s: BrokerSet, ids: frozenset[int] | None) -> None:
        if not ids:
            del self.sets[s.name]
            return
        for i in ids:
            s.replicas.pop(i, None)
            s.sync_state_set.discard(i)  # no epoch bump, master kept (upstream)
        if not s.replicas:
            del self.sets[s.name]


    # --- snapshots (beyond upstream, whose snapshot is the whole manager): the tables, no liveness -----

    def dump(self) -> bytes:
        return msgspec.json.encode([_SetRecord.of(s) for s in sorted(self.sets.values(), key=lambda s: s.name)])

    def load(self, data: bytes | None) -> None:
        self.sets = {}
        for rec in msgspec.json.decode(data, type=list[_SetRecord]) if data else []:
            self.sets[rec.name] = rec.to_set()


class _ReplicaRecord(msgspec.Struct, frozen=True):
    id: int
    address: str
    check_code: str
    principal: str = ""  # absent in snapshots made before bindings: unbound


class _SetRecord(msgspec.Struct, frozen=True):
    cluster: str
    name: str
    next_assign_id: int
    replicas: list[_ReplicaRecord]
    master_id: int | None
    master_epoch: int
    sync_state_set: list[int]
    sync_state_set_epoch: int
    fresh_epoch: int = 0  # absent in snapshots made before it: any facts

    @classmethod
    def of(cls, s: BrokerSet) -> _SetRecord:
        return cls(s.cluster, s.name, s.next_assign_id,
                   [_ReplicaRecord(i, r.address, r.check_code, r.principal) for i, r in sorted(s.replicas.items())],
                   s.master_id, s.master_epoch, sorted(s.sync_state_set), s.sync_state_set_epoch, s.fresh_epoch)

    def to_set(self) -> BrokerSet:
        return BrokerSet(self.cluster, self.name, self.next_assign_id,
                         {r.id: Replica(r.address, r.check_code, r.principal) for r in self.replicas}, self.master_id,
                         self.master_epoch, set(self.sync_state_set), self.sync_state_set_epoch, self.fresh_epoch)
