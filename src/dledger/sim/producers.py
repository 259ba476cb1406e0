"""Idempotent producers in the simulator (`python -m dledger.sim --idempotent`).

A few producers append through SimCluster as the real idempotent client does
(runtime.producer): one request in flight each, every body numbered, and a request whose
outcome is unknown (a leader change, no quorum in time, no answer) sent again with the same
sequence. What must hold whatever the faults: no body is ever in the committed log twice,
no sequence is refused (the producers send in order), and every acknowledged body is where
its answer said. A retry the leader cannot compare with the stored entry (a new leader
deleted it already: DUPLICATE_UNVERIFIABLE) is given up, as the client raises it: its bodies
are neither acknowledged nor sent again, and the producer goes on under a fresh id.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from dledger.codes import ResponseCode
from dledger.entry import MAGIC_NORMAL
from dledger.sim.cluster import SimCluster
from dledger.store.base import CorruptEntryError

# a new leader may refuse (LEADER_NOT_READY) until its table caught up: sent again, like these
_UNKNOWN = {int(c) for c in (ResponseCode.TIMEOUT, ResponseCode.TERM_CHANGED, ResponseCode.WAIT_QUORUM_ACK_TIMEOUT,
                             ResponseCode.NETWORK_ERROR, ResponseCode.LEADER_NOT_READY, ResponseCode.UNKNOWN)}
_REFUSED = {int(c) for c in (ResponseCode.OUT_OF_ORDER_SEQUENCE, ResponseCode.UNKNOWN_PRODUCER)}


@dataclass
class _Producer:
    name: str
    next_seq: int = 0
    in_flight: tuple[int, int, list[bytes]] | None = None  # (request id, sequence, bodies)
    resent: int = 0
    renewed: int = 0  # fresh ids taken after DUPLICATE_UNVERIFIABLE


@dataclass
class SimProducers:
    c: SimCluster
    r: random.Random
    count: int = 3
    producers: list[_Producer] = field(default_factory=list)
    acked: dict[bytes, int] = field(default_factory=dict)  # body -> index its answer gave
    sent: set[bytes] = field(default_factory=set)
    duplicates_answered: int = 0
    violations: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.producers = [_Producer(f"p{k}") for k in range(self.count)]

    def step(self, make_bodies: Callable[[str, int, int], list[bytes]]) -> None:
        """Settle what was answered; each idle producer sends its next bodies."""
        for p in self.producers:
            self._settle(p)
            if p.in_flight is None:
                bodies = make_bodies(p.name, p.next_seq, self.r.randint(1, 4))
                self._send(p, p.next_seq, bodies)

    def _send(self, p: _Producer, seq: int, bodies: list[bytes]) -> None:
        self.sent.update(bodies)
        cid = self.c.append(self.c.leader() or self.r.choice(self.c.ids), bodies, p.name, seq)
        p.in_flight = (cid, seq, bodies)

    def _settle(self, p: _Producer) -> None:
        if p.in_flight is None:
            return
        cid, seq, bodies = p.in_flight
        res = self.c.client_results.get(cid)
        if res is None:
            return  # not answered yet
        if res.code == ResponseCode.SUCCESS:
            answer = self.c.answers.get(cid)
            indexes = list(answer.indexes) if answer is not None and answer.indexes else \
                [res.index + k for k in range(len(bodies))]
            self.duplicates_answered += answer.duplicates if answer is not None else 0
            self.acked.update(zip(bodies, indexes, strict=True))
            p.next_seq, p.in_flight = seq + len(bodies), None
        elif res.code in _UNKNOWN:
            p.resent += 1
            self._send(p, seq, bodies)  # the same sequence: stored at most once
        elif res.code in _REFUSED:
            self.violations.append(f"{p.name}: sequence {seq} refused ({ResponseCode(res.code).name})")
            p.in_flight = None
        elif res.code == ResponseCode.DUPLICATE_UNVERIFIABLE:  # raised by the client: never sent again
            p.renewed += 1
            p.name, p.next_seq, p.in_flight = f"{p.name.split('.')[0]}.{p.renewed}", 0, None
        else:  # a definite refusal (a full disk, …): nothing stored, the same bodies go again later
            self._send(p, seq, bodies)

    def finish(self, rounds: int = 40) -> None:
        """Let every producer's last request settle (the group is whole again by now)."""
        for _ in range(rounds):
            if all(p.in_flight is None for p in self.producers):
                return
            for p in self.producers:
                self._settle(p)
            self.c.run(500)

    def check(self, leader: str) -> list[str]:
        """No body twice in the leader's log; every acknowledged body at its answered index."""
        store = self.c.stores[leader]
        counts: Counter[bytes] = Counter()
        held: dict[int, bytes] = {}
        rotten: set[int] = set()
        for index in range(store.begin_index, store.committed_index + 1):
            try:
                e = store.get(index)
            except CorruptEntryError:
                rotten.add(index)  # rot the leader could not have repaired (below every log begin)
                continue
            if e.magic == MAGIC_NORMAL:
                counts[e.body] += 1
                held[e.index] = e.body
        out = list(self.violations)
        out += [f"{b!r} is in the log {n} times" for b, n in counts.items() if n > 1 and b in self.sent][:5]
        for body, i in self.acked.items():
            if i >= store.begin_index and i not in rotten and held.get(i) != body:
                out.append(f"{body!r} acknowledged at {i}, the log holds {held.get(i)!r}")
                break
        return out
