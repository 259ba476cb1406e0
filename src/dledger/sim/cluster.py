"""SimCluster: members of the pure Raft core in one process, on a virtual clock.

The network delays, drops, duplicates and partitions messages as its seeded
random source says; every message goes through the real msgpack codec. Disks
(SimDiskStore) fsync after a delay, can be slow, full or failing, lose what was
not fsynced on power loss, and deliver the durable index to the node late, as the
flush thread does. The same seed gives the same run, so a failing seed replays
exactly.

Bit rot (`corrupt`) flips a byte of one member's record; `damaged()` lists the records
still failing verification (the repair must empty it).

Invariants checked after every event: election safety, state machine safety,
commit index monotonic, leader completeness; no member's commit index beyond its
log, nor durable index beyond what its disk holds; in sync mode every
acknowledged append on a majority of disks.

Membership (`add_member`, `change_members`): new members join as learners with an empty
store; ids are never reused, so the membership invariants can name them: at most one leader
per term across configurations (election safety above), a committed configuration never
rolls back (each member's newest committed configuration entry never goes back, and members
agree on the configuration at each such entry), and a member removed by a committed
configuration never leads.
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
from dledger.core.contexts import Answered, Applied, ChunkInstalled, ChunkRead, Durable, Restored, SnapshotTaken
from dledger.core.messages import (
    AppendRequest,
    AppendResponse,
    ChangeMembersRequest,
    ChangeMembersResponse,
    EntriesResponse,
    QueryResponse,
    ReadRequest,
    Role,
    decode_request,
    decode_response,
    encode,
)
from dledger.core.node import (
    Apply,
    DropInstall,
    InstallChunk,
    Node,
    ReadChunk,
    Reply,
    RestoreSnapshot,
    RunQuery,
    Send,
    TakeSnapshot,
)
from dledger.membership import Membership
from dledger.sim.disk import SimDiskStore
from dledger.sim.machines import SimMachines, kv_machine


@dataclass
class NetConfig:
    min_delay_ms: int = 1
    max_delay_ms: int = 5
    loss: float = 0.0
    duplicate: float = 0.0
    min_fsync_ms: int = 1
    max_fsync_ms: int = 8


@dataclass(order=True)
class _Event:
    at: int
    seq: int
    kind: str = field(compare=False)
    args: tuple[Any, ...] = field(compare=False)


_CLIENT_RETRY = {int(ResponseCode.NOT_LEADER), int(ResponseCode.LEADER_TRANSFERRING),
                 int(ResponseCode.LEADER_PENDING_FULL), int(ResponseCode.NOT_A_MEMBER)}


@dataclass
class ClientResult:
    code: int
    index: int = -1
    term: int = -1


# CHANGE_MEMBERS answers an operator asks again on (`dledger members ... --wait` does)
_CHANGE_RETRY = frozenset((ResponseCode.MEMBERSHIP_CHANGE_PENDING, ResponseCode.LEARNER_BEHIND,
                           ResponseCode.LEADER_NOT_READY,
                           ResponseCode.NOT_LEADER, ResponseCode.NOT_A_MEMBER, ResponseCode.LEADER_TRANSFERRING,
                           ResponseCode.TERM_CHANGED, ResponseCode.WAIT_QUORUM_ACK_TIMEOUT))


class SimCluster:
    def __init__(self, n: int = 3, seed: int = 0, net: NetConfig | None = None, tick_ms: int = 10,
                 **cfg_overrides: Any) -> None:
        self.rng = random.Random(seed)
        self.net = net or NetConfig()
        # state_machines=True: every member applies its log to a KV store (sim.machines); or a
        # factory of another state machine (the controller's: sim.controller)
        machines = cfg_overrides.pop("state_machines", False)
        # strict_members=True: members take leaders and candidates no configuration of theirs
        # names only once a member they know vouches for them, as with TLS (core.config_probe)
        self.strict_members = bool(cfg_overrides.pop("strict_members", False))
        with_machines = bool(machines)
        factory = (kv_machine if machines is True else machines) if with_machines else None
        self.now = 0
        self.tick_ms = tick_ms
        self.ids = [f"n{i}" for i in range(n)]
        peers = ";".join(f"{i}-{self.address(i)}" for i in self.ids)
        self.cfgs = {i: DLedgerConfig(self_id=i, peers=peers, store_type="memory", **cfg_overrides) for i in self.ids}
        self.stores = {i: SimDiskStore() for i in self.ids}
        self.last_commit: dict[str, int] = {}
        self.nodes: dict[str, Node | None] = {}
        self.blocked: set[tuple[str, str]] = set()
        self._events: list[_Event] = []
        self._seq = itertools.count()
        self._rid = itertools.count()
        # request id -> (sender, ctx, the sender's node): an answer reaches only the incarnation
        # that asked (a restarted process has no pending requests; its ctx numbering restarts)
        self._outstanding: dict[int, tuple[str, Any, Node | None]] = {}
        self.client_results: dict[int, ClientResult] = {}
        self.answers: dict[int, AppendResponse] = {}  # successful appends' whole answers
        self.test_answers: dict[Any, Any] = {}  # answers to requests a test sent itself (token ("test", ...))
        self.trace: list[str] = []
        self.leaders_by_term: dict[int, str] = {}
        self.commit_term: dict[int, int] = {}  # index -> the term it was first seen committed in
        self.committed: dict[int, tuple[int, int]] = {}  # index -> (term, chain_crc), as first seen committed
        self.violations: list[str] = []
        self._leader_checked: dict[str, int] = {}
        self._client_reqs: dict[int, tuple[bytes, int]] = {}  # cid -> (request, attempts)
        self.sync = self.cfgs[self.ids[0]].flush == "sync"
        self.quorum = n // 2 + 1
        self.fsync_ms: dict[str, tuple[int, int]] = {}  # per member, when its disk is slow
        self.acked_top: tuple[int, int, int] | None = None  # (index, term, chain) of the highest acked entry
        self.acked_quorum = self.quorum  # the disks that must hold it
        # reads (the reads invariant): each linearizable or lease read must reflect every append
        # acknowledged, and every such read answered, before it was sent
        self.acked_max = -1
        self.read_max = -1  # the highest commit index a linearizable or lease read was answered from
        self._reads: dict[int, tuple[int, str, str]] = {}  # read id -> (floor, consistency, member)
        self.reads_checked = 0
        self.corrupted: set[tuple[str, int]] = set()  # (member, index) records flipped by `corrupt`
        self._corrupt_lead: dict[tuple[str, int], int] = {}  # (leader, term) -> when it knew itself corrupt
        # (a plain log's worker draws from its own generator: the seeds' schedules stay as they were)
        self.machines = SimMachines(self.ids, random.Random(self.rng.random() if with_machines else seed), factory)
        # membership: a joining member's starting configuration (what `--join` fetches), the
        # configuration first seen committed at each CONFIG_CHANGE index, each member's newest
        # committed one, and the members committed configurations removed
        self.cfg_overrides = cfg_overrides
        self.joined: dict[str, Membership] = {}
        self.configs: dict[int, Membership] = {}
        self.config_seen: dict[str, int] = {}
        self.removed: dict[str, int] = {}  # member -> the highest term when its removal was seen committed
        self.voters: list[str] = list(self.ids)  # of the newest committed configuration seen
        self.initial = list(self.ids)
        self._config_top = -1
        for i in self.ids:
            self.start(i)

    # --- membership --------------------------------------------------------------------

    def start(self, member: str) -> None:
        store = self.stores[member]
        store.on_request = lambda: self._schedule_fsync(member)
        applier, snapshot, producers = self.machines.start(member)
        node = Node(self.cfgs[member], store, self.now, random.Random(self.rng.random()), applier=applier,
                    snapshot=snapshot, producers=producers, membership=self.joined.get(member))
        node.probe.strict = self.strict_members
        self.nodes[member] = node
        self.last_commit[member] = store.committed_index
        self.config_seen.pop(member, None)  # (its commit index restarts from the checkpoint)
        self.trace.append(f"{self.now} start {member} (end {store.end_index}, term {node.role_view().term})")
        self._schedule(self.now + self.rng.randint(0, self.tick_ms), "tick", (member,))

    def add_member(self, membership: Membership) -> str:
        """Start a new member with an empty store, as `dledger server --join` does: its id is
        the next unused one, `membership` what the group answered MEMBERS (the leader's
        configuration after adding it as a learner). Returns its id."""
        member = f"n{len(self.ids)}"
        self.ids.append(member)
        peers = ";".join(f"{i}-{self.address(i)}" for i in self.ids)
        self.cfgs[member] = DLedgerConfig(self_id=member, peers=peers, store_type="memory", **self.cfg_overrides)
        self.stores[member] = SimDiskStore()
        self.machines.add(member)
        self.joined[member] = membership
        self.trace.append(f"{self.now} new member {member}")
        self.start(member)
        return member

    @staticmethod
    def address(member: str) -> str:
        """A member's address in configurations (the simulator routes by id)."""
        return f"127.0.0.1:{20000 + int(member[1:])}"

    def change_members(self, member: str, op: str, target: str, addr: str = "") -> tuple[str, str, int]:
        """Send CHANGE_MEMBERS (`op` of `target`) to `member`; its answer lands in
        test_answers[token] (the token is returned), once the change committed or was refused."""
        token = ("test", "members", next(self._rid))
        node = self.nodes[member]
        if node is not None:
            msg = ChangeMembersRequest(self.cfgs[member].group, "", "", op, target, addr)
            node.handle(RequestCode.CHANGE_MEMBERS, msg, b"", token, self.now)
            self.trace.append(f"{self.now} {member}: {op} {target}")
            self._flush(member)
        return token

    def config(self, member: str) -> Membership:
        """`member`'s configuration in force."""
        return self._node(member).configs.current

    def crash(self, member: str, lose_unsynced: bool = True) -> None:
        """Stop a member; with `lose_unsynced` its unflushed writes are gone (power loss)."""
        self.nodes[member] = None
        store = self.stores[member]
        if lose_unsynced:
            store.crash()
        else:
            store.sync_all()  # the OS writes the page cache out
            store.crash()
        self.trace.append(f"{self.now} crash {member} ({'power loss' if lose_unsynced else 'process'}, "
                          f"keeps end {store.end_index})")

    def partition(self, *groups: list[str]) -> None:
        """Only members in the same group can talk."""
        side = {m: k for k, g in enumerate(groups) for m in g}
        self.blocked = {(a, b) for a in self.ids for b in self.ids if side.get(a, -1) != side.get(b, -2)}
        self.trace.append(f"{self.now} partition {groups}")

    def heal(self) -> None:
        self.blocked = set()
        self.trace.append(f"{self.now} heal")

    # --- disk faults -------------------------------------------------------------------------

    def slow_disk(self, member: str, lo_ms: int, hi_ms: int) -> None:
        """fsyncs of `member` take lo..hi ms (slower than every timeout when in seconds)."""
        self.fsync_ms[member] = (lo_ms, hi_ms)
        self.trace.append(f"{self.now} disk of {member}: fsync {lo_ms}..{hi_ms} ms")

    def disk_fault(self, member: str, kind: str, on: bool = True) -> None:
        """kind: full (out of space) | soft_full (above the force-clean ratio) | pressure |
        write_error (the next append fails) | fsync_error (the next fsync fails: the store
        fails for good) | repair (a failed disk replaced)."""
        st = self.stores[member]
        if kind == "full":
            st.full = on
        elif kind == "soft_full":
            st.soft_full = on
        elif kind == "pressure":
            st.pressure = on
        elif kind == "write_error":
            st.write_error_once = True
        elif kind == "fsync_error":
            st.fsync_error_once = True
        elif kind == "repair":
            st.failed = None
            st.fsync_error_once = st.write_error_once = False
        self.trace.append(f"{self.now} disk of {member}: {kind}{'' if on else ' off'}")

    def corrupt(self, member: str, index: int, field: str = "body") -> None:
        """Bit rot: flip a byte of `member`'s record of `index` (see SimDiskStore.corrupt)."""
        self.stores[member].corrupt(index, field)
        self.corrupted.add((member, index))
        self.trace.append(f"{self.now} disk of {member}: record {index} corrupt ({field})")

    def damaged(self) -> list[tuple[str, int]]:
        """The records `corrupt` damaged that still fail verification (a truncate or retention
        may have removed some)."""
        still = set()
        for m, i in self.corrupted:
            st = self.stores[m]
            if st.begin_index <= i <= st.end_index and st.verify(i) is not None:
                still.add((m, i))
        self.corrupted = still
        return sorted(still)

    def healthy_disks(self) -> list[str]:
        """Members that are up with a fast disk that can write, and no corrupt record (such a
        member does not lead: it does not count toward a live majority)."""
        rotten = {m for m, _ in self.damaged()}
        return [i for i, n in self.nodes.items() if n is not None and i not in self.fsync_ms
                and self.stores[i].write_error() is None and self.stores[i].pressure_error() is None
                and not self.stores[i].fsync_error_once and i not in rotten]

    # --- client ----------------------------------------------------------------------------

    def append(self, member: str, bodies: list[bytes], producer: str = "", sequence: int = 0) -> int:
        """Submit an append to `member` (as `producer`'s bodies from `sequence`: idempotent);
        its answer lands in client_results[id]."""
        cid = next(self._rid)
        # unaddressed: it may be redirected
        msg = AppendRequest(self.cfgs[member].group, "", "", bodies, producer=producer, sequence=sequence)
        self._client_reqs[cid] = (encode(msg), 0)
        self._schedule(self.now + 1, "client", (member, cid, self._client_reqs[cid][0]))
        return cid

    def read(self, member: str, consistency: str, addressed: bool = False) -> int:
        """Send a READ to `member` (by name when `addressed`: a follower read) of the entry the
        reads invariant says it must hold; its answer is checked when it comes (_check_read)."""
        rid = next(self._rid)
        floor = max(self.acked_max, self.read_max)
        msg = ReadRequest(self.cfgs[member].group, "", member, max(floor, 0), 1, 1 << 20, False, False, consistency,
                          follower_read=addressed)
        self._reads[rid] = (floor, consistency, member)
        self._schedule(self.now + 1, "read", (member, rid, encode(msg)))
        return rid

    def _on_read(self, member: str, rid: int, meta: bytes) -> None:
        node = self.nodes[member]
        if node is None:
            self._reads.pop(rid, None)
            return
        node.handle(RequestCode.READ, decode_request(RequestCode.READ, meta), b"", ("read", rid), self.now)
        self._flush(member)

    def _check_read(self, member: str, rid: int, r: EntriesResponse) -> None:
        """A linearizable or lease read never goes back in time: it is answered from a commit
        index at least as high as every acknowledged append and every such read answered before
        it was sent (a read told that such an index is not committed is stale too)."""
        floor, consistency, _ = self._reads.pop(rid, (-1, "", member))
        if r.code == ResponseCode.SUCCESS:
            self.reads_checked += 1
            if r.committed_index < floor:
                self.violations.append(f"{self.now}: {consistency} read at {member} answered from commit index "
                                       f"{r.committed_index}, below {floor} acknowledged or read before it was sent")
            self.read_max = max(self.read_max, r.committed_index)
        elif r.code == ResponseCode.INDEX_OUT_OF_RANGE and floor >= 0:
            self.violations.append(f"{self.now}: {consistency} read at {member} says {floor} is not committed, "
                                   f"but it was acknowledged or read before the read was sent")

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
            try:
                getattr(self, "_on_" + ev.kind)(*ev.args)
            except Exception as e:  # the runtime logs it and goes on with whatever state is left
                self.violations.append(f"{self.now}: {ev.kind} {ev.args[:2]} raised {type(e).__name__}: {e}")
                self.trace.append(f"{self.now} EXCEPTION in {ev.kind}: {type(e).__name__}: {e}")
                if ev.kind == "tick":
                    self._schedule(self.now + self.tick_ms, "tick", (ev.args[0],))  # the ticker survives
            self._check_invariants()
        self.now = max(self.now, end)
        return cond()

    def leader(self) -> str | None:
        views = {i: n.role_view() for i, n in self.nodes.items() if n is not None}
        leaders = [i for i, st in views.items() if st.role == Role.LEADER]
        return max(leaders, key=lambda i: views[i].term) if leaders else None

    def wait_leader(self, max_ms: int = 10_000) -> str:
        """Run until a member leads; its id (AssertionError if none does within `max_ms`)."""
        assert self.run_until(lambda: self.leader() is not None, max_ms), f"no leader within {max_ms} ms"
        leader = self.leader()
        assert leader is not None
        return leader

    def change(self, op: str, target: str, addr: str = "", tries: int = 100) -> ChangeMembersResponse:
        """CHANGE_MEMBERS at the leader, asked again while it answers what an operator retries
        (a change pending, a learner behind, a new leader, a term change): the last answer."""
        r: ChangeMembersResponse | None = None
        for _ in range(tries):
            token = self.change_members(self.wait_leader(), op, target, addr)
            self.run_until(lambda token=token: token in self.test_answers, 10_000)  # type: ignore[misc]
            r = self.test_answers.get(token)
            assert isinstance(r, ChangeMembersResponse), r
            if r.code not in _CHANGE_RETRY:
                return r
            self.run(100)
        assert r is not None
        return r

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
        store = self.stores[member]
        store.run_retention()
        if not self.sync:
            store.request_flush()  # the flush thread's interval (flush_interval_ms)
        self._flush(member)
        self._schedule(self.now + self.tick_ms, "tick", (member,))

    def _client_retry(self, cid: int, hint: str | None) -> bool:
        """Follow a redirect (or try another member) as the real client does."""
        meta, attempts = self._client_reqs[cid]
        if attempts >= 20:
            self.client_results[cid] = ClientResult(int(ResponseCode.TIMEOUT))
            return False
        self._client_reqs[cid] = (meta, attempts + 1)
        target = hint if hint in self.ids else self.rng.choice(self.ids)
        self._schedule(self.now + (1 if hint else 50), "client", (target, cid, meta))
        return True

    def _schedule_fsync(self, member: str) -> None:
        lo, hi = self.fsync_ms.get(member, (self.net.min_fsync_ms, self.net.max_fsync_ms))
        self._schedule(self.now + self.rng.randint(lo, hi), "fsync", (member, self.stores[member].generation))

    def _on_fsync(self, member: str, generation: int | None = None) -> None:
        store = self.stores[member]
        if generation is None:
            generation = store.generation  # scheduled by hand (the audit scripts): the current disk
        if store.generation != generation:
            return  # the member lost power while this fsync ran
        durable = store.complete_flush()
        # the flush thread's news reaches the node later (call_soon_threadsafe): by then a
        # truncate may have lowered the durable index, so the value is only a hint
        self._schedule(self.now + self.rng.randint(0, 3), "durable", (member, durable, generation))

    def _on_durable(self, member: str, durable: int, generation: int) -> None:
        node = self.nodes[member]
        if node is None or self.stores[member].generation != generation:
            return
        node.complete(Durable(durable), self.now)
        self._flush(member)

    def _on_client(self, member: str, cid: int, meta: bytes) -> None:
        node = self.nodes[member]
        if node is None:
            self._client_retry(cid, None)
            return
        node.handle(RequestCode.APPEND, decode_request(RequestCode.APPEND, meta), b"", ("client", cid), self.now)
        self._flush(member)

    def _on_request(self, src: str, dst: str, rid: int, code: int, meta: bytes, data: bytes) -> None:
        node = self.nodes.get(dst)  # (a member added to the configuration may not run yet)
        if node is None:
            return  # the sender's timeout fires
        node.handle(code, decode_request(code, meta), data, ("peer", src, rid, code), self.now)
        self._flush(dst)

    def _on_response(self, dst: str, rid: int, code: int, meta: bytes | None) -> None:
        pending = self._outstanding.pop(rid, None)
        node = self.nodes[dst]
        if pending is None or node is None or pending[0] != dst or pending[2] is not node:
            return
        resp = decode_response(code, meta) if meta is not None else None
        node.complete(Answered(pending[1], resp), self.now)
        self._flush(dst)

    def _flush(self, member: str) -> None:
        node = self.nodes[member]
        if node is None:
            return
        for action in node.drain():
            if isinstance(action, Send):
                self._send(member, action)
            elif isinstance(action, Reply):
                self._reply(member, action)
            elif isinstance(action, ReadChunk):  # the reader thread: beside the worker
                self._schedule(self.now + self.rng.randint(0, 2), "read_chunk", (member, node, action))
            else:  # the member's worker, in order
                self._schedule(self.machines.work_at(member, self.now), "work", (member, node, action))

    def _on_read_chunk(self, member: str, node: Node, a: ReadChunk) -> None:
        if self.nodes[member] is not node:
            return
        data, crc, error = self.machines.read_chunk(member, a.meta, a.offset, a.max_bytes)
        node.complete(ChunkRead(a.peer, a.ctx, data, crc, error), self.now)
        self._flush(member)

    def _on_work(self, member: str, node: Node, action: Apply | RunQuery | TakeSnapshot | InstallChunk
                 | RestoreSnapshot | DropInstall) -> None:
        m = self.machines
        if self.nodes[member] is not node:
            return  # the member crashed: what its worker had queued is gone
        if isinstance(action, Apply):
            node.complete(Applied(m.apply(member, action.batch.entries)), self.now)
            problem = m.check(member, node.role_view().applied_index)
            if problem is not None:
                self.violations.append(f"{self.now}: {problem}")
        elif isinstance(action, RunQuery):
            resp = QueryResponse(200, node.role_view().leader_id, m.query(member, action.request),
                                 action.applied_index)
            self._reply(member, Reply(action.token, RequestCode.QUERY, resp))
        elif isinstance(action, TakeSnapshot):
            meta = m.snapshot(member, action.index, action.term, action.chain_crc, action.next_pos,
                              action.members or node.cfg.peers, action.keep, action.producers, action.config_index)
            self.trace.append(f"{self.now} {member} snapshot through {action.index}")
            node.complete(SnapshotTaken(action.index, "", meta), self.now)
        elif isinstance(action, DropInstall):
            m.drop_install(member)
        elif isinstance(action, InstallChunk):
            nxt, done = m.install_chunk(member, action.meta, action.offset, action.data, action.crc)
            if done:
                self.trace.append(f"{self.now} {member} installed snapshot {action.meta.last_index}")
            node.complete(ChunkInstalled(action.token, action.meta, nxt, done, ""), self.now)
        else:
            node.complete(Restored(action.meta, "", m.restore_installed(member, action.meta)), self.now)
            if (st := node.role_view()).has_state_machine:
                problem = m.check(member, st.applied_index)
                if problem is not None:
                    self.violations.append(f"{self.now}: after installing a snapshot: {problem}")
        self._flush(member)

    def _send(self, src: str, a: Send) -> None:
        rid = next(self._rid)
        self._outstanding[rid] = (src, a.ctx, self.nodes[src])
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
            if r.code in _CLIENT_RETRY and self._client_retry(token[1], r.leader_id or None):
                return
            if r.code == ResponseCode.SUCCESS:
                self._note_acked(member, max(r.indexes) if r.indexes else r.index + len(r.positions) - 1)
                self.answers[token[1]] = r
            self.client_results[token[1]] = ClientResult(r.code, r.index, r.term)
            self._client_reqs.pop(token[1], None)
            return
        if token[0] == "read":
            assert isinstance(a.msg, EntriesResponse)
            self._check_read(member, token[1], a.msg)
            return
        if token[0] == "test":  # a test's own request (tests/sim): its answer, whenever it comes
            self.test_answers[token] = a.msg
            return
        _, src, rid, code = token
        if (member, src) in self.blocked or self.rng.random() < self.net.loss:
            return
        delay = self.rng.randint(self.net.min_delay_ms, self.net.max_delay_ms)
        self._schedule(self.now + delay, "response", (src, rid, code, encode(a.msg)))

    # --- invariants ------------------------------------------------------------------------------

    def _note_acked(self, leader: str, last: int) -> None:
        """An append was acknowledged: remember the highest acknowledged entry as it is."""
        self.acked_max = max(self.acked_max, last)
        # (a duplicate answered with an original index that retention has deleted since: nothing to note)
        if (self.acked_top is None or last > self.acked_top[0]) and last >= self.stores[leader].begin_index:
            self.acked_top = (last, *self.stores[leader].term_chain(last)[:2])
            # a majority of the voters in force on the leader (a configuration takes effect when
            # appended: one that removed a voter may commit the entries before it)
            node = self.nodes[leader]
            self.acked_quorum = min(self.quorum, node.member.quorum) if node is not None else self.quorum

    def _check_invariants(self) -> None:
        """After every event: election safety, state machine safety (no two members
        commit different entries at an index), commit index monotonic while alive,
        leader completeness (a leader holds every committed entry); no commit index past
        the log end nor durable index past the disk; in sync mode, every acknowledged
        append on a majority of disks."""
        for i, store in self.stores.items():
            if store.committed_index > store.end_index or store.durable_index > store.synced_index:
                self.violations.append(f"{self.now}: {i} claims beyond its disk: commit {store.committed_index}, "
                                       f"durable {store.durable_index}, end {store.end_index}, "
                                       f"on disk {store.synced_index}")
        for i, node in self.nodes.items():
            if node is None:
                continue
            m = node.role_view()
            store = self.stores[i]
            c = store.committed_index
            if c < self.last_commit.get(i, -1):
                self.violations.append(f"{self.now}: {i} commit index went back {self.last_commit[i]} -> {c}")
            if c > self.last_commit.get(i, -1):
                for idx in range(max(self.last_commit.get(i, -1) + 1, store.begin_index), c + 1):
                    tc = store.term_chain(idx)[:2]
                    self.commit_term.setdefault(idx, m.term)  # the term it was first seen committed in
                    seen = self.committed.setdefault(idx, tc)
                    if seen != tc:
                        self.violations.append(f"{self.now}: {i} committed a different entry at {idx}")
            self.last_commit[i] = c
            if m.role == Role.LEADER and m.corrupt_index >= 0:
                since = self._corrupt_lead.setdefault((i, m.term), self.now)
                if self.now - since > node.cfg.leadership_transfer_timeout_ms + 2 * self.tick_ms:
                    self.violations.append(f"{self.now}: {i} still leads term {m.term} with a corrupt record "
                                           f"{m.corrupt_index} known since {since}")
                    self._corrupt_lead[(i, m.term)] = 1 << 62  # report once
            if node.configs.version or len(self.configs):
                self._check_config(i, node, c)
            if m.role == Role.LEADER:
                if m.term > self.removed.get(i, 1 << 62):
                    self.violations.append(f"{self.now}: {i} leads term {m.term} after a committed configuration "
                                           f"removed it in term {self.removed[i]}")
                    self.removed[i] = 1 << 62  # report once
                other = self.leaders_by_term.setdefault(m.term, i)
                if other != i:
                    self.violations.append(f"{self.now}: two leaders in term {m.term}: {other} and {i}")
                if self._leader_checked.get(i) != m.term:
                    self._leader_checked[i] = m.term
                    self.trace.append(f"{self.now} {i} leads term {m.term} (end {store.end_index})")
                    self._check_completeness(i, store)
        # (after the configurations: an entry acknowledged commits the configuration before it)
        if self.sync and self.acked_top is not None:
            self._check_acked_durable()

    def _check_config(self, member: str, node: Node, commit: int) -> None:
        """A committed configuration never rolls back: `member`'s newest committed configuration
        entry never goes back while it runs, and every member holds the same configuration at
        each such entry; the members it removed never lead again (ids are never reused)."""
        index, cfg = node.configs.committed(commit)
        seen = self.config_seen.get(member, -1)
        if index < seen:
            self.violations.append(f"{self.now}: {member}'s committed configuration went back {seen} -> {index}")
        self.config_seen[member] = index
        if index < 0:
            return
        first = self.configs.setdefault(index, cfg)
        if first != cfg:
            self.violations.append(f"{self.now}: {member} holds configuration {cfg} at committed entry {index}, "
                                   f"another member {first}")
        elif index > self._config_top:  # the newest yet: the members it dropped are removed
            prev = self.configs.get(self._config_top)
            self._config_top = index
            before = set(prev.members) if prev is not None else set(self.initial)
            term = max(n.role_view().term for n in self.nodes.values() if n is not None)
            for gone in before - set(cfg.members):
                self.removed.setdefault(gone, term)
            self.voters = list(cfg.voters)
            self.quorum = len(cfg.voters) // 2 + 1
            self.trace.append(f"{self.now} configuration {index} committed: voters {','.join(cfg.voters)}, "
                              f"learners {','.join(cfg.learners) or 'none'}")

    def _check_acked_durable(self) -> None:
        """The highest acknowledged entry is on a majority of disks (fsynced, same chain CRC);
        the chain CRC covers the prefix, so every lower acknowledged entry is there too."""
        assert self.acked_top is not None
        index, term, chain = self.acked_top
        holders = [i for i, st in self.stores.items() if _on_disk(st, index, term, chain)]
        if len(holders) < self.acked_quorum:
            self.violations.append(f"{self.now}: acknowledged entry {index} is on the disks of only {holders}")
            self.acked_top = None  # report once

    def _check_completeness(self, leader: str, store: SimDiskStore) -> None:
        # Leader Completeness covers entries committed in earlier terms: a leader of a lower
        # term elected (on delayed answers) after a higher term committed need not hold those
        term = self._node(leader).role_view().term
        top = max((i for i, t in self.commit_term.items() if t < term), default=-1)
        if store.end_index < top:
            self.violations.append(f"{self.now}: leader {leader} lacks committed entries {store.end_index + 1}..{top}")
            return
        if top >= store.begin_index and store.term_chain(top)[:2] != self.committed[top]:
            self.violations.append(f"{self.now}: leader {leader} holds a different entry at committed {top}")

    def check_log_matching(self) -> None:
        """Where two members hold an entry of the same term at an index, their
        chain CRCs (and so their whole prefixes) are equal, and so are their magics (which no
        CRC covers) unless one copy is known rotten."""
        ids = [i for i in self.ids]
        rotten = set(self.damaged())
        for k, a in enumerate(ids):
            for b in ids[k + 1 :]:
                sa, sb = self.stores[a], self.stores[b]
                for idx in range(max(sa.begin_index, sb.begin_index), min(sa.end_index, sb.end_index) + 1):
                    ea, eb = sa.term_chain(idx), sb.term_chain(idx)
                    if ea[0] == eb[0] and ea[1] != eb[1]:
                        self.violations.append(f"log matching broken between {a} and {b} at {idx}")
                        return
                    if ea[0] == eb[0] and ea[2] != eb[2] and (a, idx) not in rotten and (b, idx) not in rotten:
                        self.violations.append(f"{a} and {b} hold entry {idx} with magics {ea[2]} and {eb[2]}")
                        return


def _on_disk(st: SimDiskStore, index: int, term: int, chain: int) -> bool:
    if index < st.begin_index:
        return True  # deleted by retention, which only deletes committed, fsynced entries
    if index > st.synced_index:
        return False
    return st.term_chain(index)[:2] == (term, chain)
