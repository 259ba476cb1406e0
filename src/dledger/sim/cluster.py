"""SimCluster: members of the pure Raft core in one process, on a virtual clock.

The network delays, drops, duplicates and partitions messages as its seeded
random source says; every message goes through the real msgpack codec. The
same seed gives the same run, so a failing seed replays exactly.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dledger.codes import RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.messages import AppendRequest, AppendResponse, Role, decode_request, decode_response, encode
from dledger.core.node import Node, Reply, Send
from dledger.store.memory import MemoryLedgerStore


@dataclass
class NetConfig:
    min_delay_ms: int = 1
    max_delay_ms: int = 5
    loss: float = 0.0
    duplicate: float = 0.0


@dataclass(order=True)
class _Event:
    at: int
    seq: int
    kind: str = field(compare=False)
    args: tuple[Any, ...] = field(compare=False)


@dataclass
class ClientResult:
    code: int
    index: int = -1
    term: int = -1


class SimCluster:
    def __init__(self, n: int = 3, seed: int = 0, net: NetConfig | None = None, tick_ms: int = 10,
                 **cfg_overrides: Any) -> None:
        self.rng = random.Random(seed)
        self.net = net or NetConfig()
        self.now = 0
        self.tick_ms = tick_ms
        self.ids = [f"n{i}" for i in range(n)]
        peers = ";".join(f"{i}-127.0.0.1:{20000 + k}" for k, i in enumerate(self.ids))
        self.cfgs = {i: DLedgerConfig(self_id=i, peers=peers, store_type="memory", **cfg_overrides) for i in self.ids}
        self.stores = {i: MemoryLedgerStore() for i in self.ids}
        self.nodes: dict[str, Node | None] = {}
        self.blocked: set[tuple[str, str]] = set()
        self._events: list[_Event] = []
        self._seq = itertools.count()
        self._rid = itertools.count()
        self._outstanding: dict[int, tuple[str, Any]] = {}  # request id -> (sender, ctx)
        self.client_results: dict[int, ClientResult] = {}
        self.trace: list[str] = []
        self.leaders_by_term: dict[int, str] = {}
        self.committed: dict[int, tuple[int, int]] = {}  # index -> (term, chain_crc), as first seen committed
        self.violations: list[str] = []
        for i in self.ids:
            self.start(i)

    # --- membership --------------------------------------------------------------------

    def start(self, member: str) -> None:
        node = Node(self.cfgs[member], self.stores[member], self.now, random.Random(self.rng.random()))
        self.nodes[member] = node
        self._schedule(self.now + self.rng.randint(0, self.tick_ms), "tick", (member,))

    def crash(self, member: str) -> None:
        self.nodes[member] = None
        self.trace.append(f"{self.now} crash {member}")

    def partition(self, *groups: list[str]) -> None:
        """Only members in the same group can talk."""
        side = {m: k for k, g in enumerate(groups) for m in g}
        self.blocked = {(a, b) for a in self.ids for b in self.ids if side.get(a, -1) != side.get(b, -2)}
        self.trace.append(f"{self.now} partition {groups}")

    def heal(self) -> None:
        self.blocked = set()
        self.trace.append(f"{self.now} heal")

    # --- client ----------------------------------------------------------------------------

    def append(self, member: str, bodies: list[bytes]) -> int:
        """Submit an append to `member`; its answer lands in client_results[id]."""
        cid = next(self._rid)
        msg = AppendRequest(self.cfgs[member].group, "", member, bodies)
        self._schedule(self.now + 1, "client", (member, cid, encode(msg)))
        return cid

    # --- running ----------------------------------------------------------------------------

    def run(self, ms: int) -> None:
        self.run_until(lambda: False, ms)

    def run_until(self, cond: Callable[[], bool], max_ms: int) -> bool:
        end = self.now + max_ms
        while self._events and self._events[0].at <= end:
            if cond():
                return True
            ev = heapq.heappop(self._events)
            self.now = ev.at
            getattr(self, "_on_" + ev.kind)(*ev.args)
            self._check_invariants()
        self.now = max(self.now, end)
        return cond()

    def leader(self) -> str | None:
        leaders = [i for i, n in self.nodes.items() if n is not None and n.member.role == Role.LEADER]
        return max(leaders, key=lambda i: self._node(i).member.term) if leaders else None

    def _node(self, member: str) -> Node:
        node = self.nodes[member]
        assert node is not None
        return node

    # --- events --------------------------------------------------------------------------------

    def _schedule(self, at: int, kind: str, args: tuple[Any, ...]) -> None:
        heapq.heappush(self._events, _Event(at, next(self._seq), kind, args))

    def _on_tick(self, member: str) -> None:
        node = self.nodes[member]
        if node is None:
            return
        node.tick(self.now)
        self._flush(member)
        self._schedule(self.now + self.tick_ms, "tick", (member,))

    def _on_client(self, member: str, cid: int, meta: bytes) -> None:
        node = self.nodes[member]
        if node is None:
            self.client_results[cid] = ClientResult(int(ResponseCode.NETWORK_ERROR))
            return
        node.handle(RequestCode.APPEND, decode_request(RequestCode.APPEND, meta), b"", ("client", cid), self.now)
        self._flush(member)

    def _on_request(self, src: str, dst: str, rid: int, code: int, meta: bytes, data: bytes) -> None:
        node = self.nodes[dst]
        if node is None:
            return  # the sender's timeout fires
        node.handle(code, decode_request(code, meta), data, ("peer", src, rid, code), self.now)
        self._flush(dst)

    def _on_response(self, dst: str, rid: int, code: int, meta: bytes | None) -> None:
        pending = self._outstanding.pop(rid, None)
        node = self.nodes[dst]
        if pending is None or node is None or pending[0] != dst:
            return
        resp = decode_response(code, meta) if meta is not None else None
        node.on_response(pending[1], resp, self.now)
        self._flush(dst)

    def _flush(self, member: str) -> None:
        node = self.nodes[member]
        if node is None:
            return
        for action in node.drain():
            if isinstance(action, Send):
                self._send(member, action)
            else:
                self._reply(member, action)

    def _send(self, src: str, a: Send) -> None:
        rid = next(self._rid)
        self._outstanding[rid] = (src, a.ctx)
        self._schedule(self.now + a.timeout_ms, "response", (src, rid, a.code, None))
        if (src, a.peer) in self.blocked or self.rng.random() < self.net.loss:
            return
        copies = 2 if self.rng.random() < self.net.duplicate else 1
        for _ in range(copies):
            delay = self.rng.randint(self.net.min_delay_ms, self.net.max_delay_ms)
            self._schedule(self.now + delay, "request", (src, a.peer, rid, a.code, encode(a.msg), bytes(a.data)))

    def _reply(self, member: str, a: Reply) -> None:
        token = a.token
        if token[0] == "client":
            r = a.msg
            assert isinstance(r, AppendResponse)
            self.client_results[token[1]] = ClientResult(r.code, r.index, r.term)
            return
        _, src, rid, code = token
        if (member, src) in self.blocked or self.rng.random() < self.net.loss:
            return
        delay = self.rng.randint(self.net.min_delay_ms, self.net.max_delay_ms)
        self._schedule(self.now + delay, "response", (src, rid, code, encode(a.msg)))

    # --- invariants ------------------------------------------------------------------------------

    def _check_invariants(self) -> None:
        """Election safety, log matching on committed entries, commit monotonic."""
        for i, node in self.nodes.items():
            if node is None:
                continue
            m = node.member
            if m.role == Role.LEADER:
                other = self.leaders_by_term.setdefault(m.term, i)
                if other != i:
                    self.violations.append(f"{self.now}: two leaders in term {m.term}: {other} and {i}")
            store = self.stores[i]
            top = max(self.committed, default=-1)
            for idx in range(top + 1, store.committed_index + 1):
                e = store.get(idx)
                self.committed[idx] = (e.term, e.chain_crc)
            c = store.committed_index
            if c >= 0 and c in self.committed:
                e = store.get(c)
                if self.committed[c] != (e.term, e.chain_crc):
                    self.violations.append(f"{self.now}: {i} committed a different entry at {c}")


