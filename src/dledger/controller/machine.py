"""The controller as a dledger state machine: its log entries are `Command`s (a request and the
leader's liveness facts), applied by `processor.process` in log order on every controller.

Apply's result for an entry is the encoded answer, which the leader hands back to whoever
sent the request. Reads are queries with the same shape (answered from the applied state,
after the read index confirmed the leader: never a stale answer after a silent leader loss,
unlike upstream's default). Snapshots hold the tables as JSON: a controller
restarts from its newest snapshot, not from the whole log (upstream never snapshots, #5585).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import msgspec

from dledger.codes import ControllerResponseCode as RC
from dledger.controller import messages as m
from dledger.controller.processor import process
from dledger.controller.state import BindPrincipalEvent, ControllerState, Event
from dledger.statemachine.api import AppliedEntry, SnapshotReader, SnapshotWriter, StateMachine

log = logging.getLogger(__name__)

SNAPSHOT_FILE = "controller.json"


class BrokerSetBrief(msgspec.Struct, frozen=True):
    """What the leader's scan needs of a broker set (a copy: the state changes on another thread)."""

    name: str
    master_id: int | None
    master_epoch: int
    sync_state_set: frozenset[int]
    replicas: frozenset[int]
    fresh_epoch: int = 0  # after a master restart: elect only once every live candidate reported at or past it


class ControllerStateMachine(StateMachine):
    def __init__(self) -> None:
        self.state = ControllerState()
        self.applied_events = 0  # events applied since start (tests and metrics)
        self.last_events: list[Event] = []  # the events of the last entry applied

    def apply(self, entries: Sequence[AppliedEntry]) -> Sequence[bytes]:
        return [self._apply_one(e) for e in entries]

    def _apply_one(self, e: AppliedEntry) -> bytes:
        try:
            cmd = m.decode_command(e.body)
        except m.DECODE_ERRORS as err:  # the controller logs only its own commands; stay a function of the log
            log.warning("entry %d is not a controller command: %s", e.index, err)
            return m.encode(m.Response(int(RC.SYSTEM_ERROR), f"not a controller command: {err}"))
        resp, events = process(self.state, cmd)
        for ev in events:
            self.state.apply(ev)
            if isinstance(ev, BindPrincipalEvent):
                log.warning("broker %s id %d, registered before bindings, is now bound to certificate CN=%s",
                            ev.broker, ev.broker_id, ev.principal)
        self.applied_events += len(events)
        self.last_events = events
        return m.encode(resp)

    def query(self, request: bytes) -> bytes:
        cmd = m.decode_command(request)
        if not isinstance(cmd.request, m.GetNextBrokerId | m.GetReplicaInfo | m.GetSyncStateData):
            raise ValueError(f"{type(cmd.request).__name__} is not a read")
        return m.encode(process(self.state, cmd)[0])

    def brief(self) -> list[BrokerSetBrief]:
        """Every broker set, copied (run it on the state machine's thread)."""
        return [BrokerSetBrief(s.name, s.master_id, s.master_epoch, frozenset(s.sync_state_set), frozenset(s.replicas),
                               s.fresh_epoch)
                for s in self.state.sets.values()]

    def principal_of(self, broker: str, broker_id: int) -> str:
        """The certificate name bound to a replica ("": none). Safe from the event loop's thread
        while the worker applies: two dict lookups, each atomic; at worst one entry stale."""
        s = self.state.get(broker)
        return s.principal_of(broker_id) if s is not None else ""

    def snapshot(self, writer: SnapshotWriter) -> None:
        with writer.open(SNAPSHOT_FILE) as f:
            f.write(self.state.dump())

    def restore(self, reader: SnapshotReader | None) -> None:
        state = ControllerState()
        if reader is not None and SNAPSHOT_FILE in reader.names():
            with reader.open(SNAPSHOT_FILE) as f:
                state.load(f.read())
        self.state = state
