"""ReadPath: a member's answers to GET and READ, and when a read may be served.

Committed entries only, from the leader unless the reader asked for this member's own copy
(`local`), whose commit index may lag; a follower serves a follower read once it committed the
leader's read index (core.follower_read); `linearizable` and `lease` reads wait for ReadIndex
(core.read_index); a READ with `wait_ms` for an index not committed yet is parked (core.long_poll).
Built from a narrow context: the store, the member's state and options, where replies go, the
time, and the few facts of other parts it needs (a transfer under way, our corrupt record);
marking a record corrupt is the node's (`mark_corrupt`).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.config import DLedgerConfig
from dledger.core.follower_read import FollowerReads
from dledger.core.long_poll import MAX_WAIT_MS, LongPolls
from dledger.core.member_state import MemberState
from dledger.core.messages import CONSISTENCY, EntriesResponse, EntryMsg
from dledger.core.producers import redacted_marker
from dledger.core.read_index import ReadIndex, describe
from dledger.entry import MAGIC_NORMAL, MAGIC_SESSION
from dledger.store.base import CorruptEntryError, LedgerStore

# What an entry costs an answer beyond its body (its fields, encoded): empty bodies count too.
_ENTRY_OVERHEAD = 48
# Long polls released by a commit (core.long_poll): each answer is a smaller page than a
# plain READ's (a follower of the tail asks again from `next_index` for the rest), and one
# drain answers parked polls worth at most LONG_POLL_DRAIN_BYTES (at least one), the rest
# at the next drains in index order: 50 polls released by one 16 MiB append took a member
# from 87 to 497 MB, and deposed the leader.
_NORMAL_ONLY = frozenset((MAGIC_NORMAL,))
_R = TypeVar("_R")  # what one store read returns (entries, or columns)
LONG_POLL_PAGE_BYTES = 1 << 20
MARKER_SCAN = 1 << 20  # indexes a markers-only READ looks through (their index units: 32 MiB)
LONG_POLL_DRAIN_BYTES = 8 << 20

ReplyTo = Callable[[Any, int, msgspec.Struct], None]
ErrorFor = Callable[[int, ResponseCode, str], msgspec.Struct]


def _little(a: array[int]) -> bytes:
    """An int64 column as the wire carries it: little-endian (docs/format.md, columnar READ)."""
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


class ReadPath:
    def __init__(self, store: LedgerStore, member: MemberState, cfg: DLedgerConfig, reply: ReplyTo,
                 error: ErrorFor, clock: Callable[[], int], transferring: Callable[[], bool],
                 mark_corrupt: Callable[[int, str], None], read_index: ReadIndex,
                 follower_reads: FollowerReads) -> None:
        self.store = store
        self.member = member
        self.cfg = cfg
        self._reply = reply
        self._error = error  # an error answer of the right type for a request code
        self._now = clock
        self._transferring = transferring
        self._mark_corrupt = mark_corrupt
        self.read_index = read_index
        self.follower_reads = follower_reads
        self.long_polls = LongPolls()
        self.entries_read = 0  # entries sent in GET/READ answers (metrics)
        self.read_body_bytes = 0  # ... and their body bytes (a READ without bodies sends none)

    def handle_read(self, code: int, start: int, max_entries: int, max_bytes: int, only_normal: bool,
                     local: bool, consistency: str, token: Any, wait_ms: int = 0, addressed: bool = False,
                     bodies: bool = True, markers: bool = False, columnar: bool = False) -> None:
        """Committed entries only, from the leader unless the reader asked for this member's
        own copy (`local`), whose commit index may lag. From the leader an append acknowledged
        to one client is readable by every other client at once; `linearizable` and `lease`
        also rule out a deposed leader that does not know it yet (see read_index), and a
        follower serves a follower read (`follower_read`) once it committed the leader's read index."""
        def own_copy() -> bool:  # a follower's read (local or a follower read) is its own copy
            return local or not self.member.is_leader

        def answer(cap: int = max_bytes) -> int:
            if markers:
                return self._answer_markers(start, max_entries, token)
            if columnar and only_normal and code == RequestCode.READ:
                return self._answer_columns(start, max_entries, cap, own_copy(), token, bodies)
            return self._answer(code, start, max_entries, cap, only_normal, own_copy(), token, bodies)

        def answer_or_wait(_: int = -1) -> None:
            if wait_ms > 0 and start > self.store.committed_index:
                self._park(start, wait_ms, own_copy(), lambda: answer(min(max_bytes, LONG_POLL_PAGE_BYTES)),
                                token)
            else:
                answer()

        if local:
            answer_or_wait()
        else:
            self.when_confirmed(code, consistency, token, answer_or_wait, addressed)

    def _park(self, start: int, wait_ms: int, local: bool, answer: Callable[[], int], token: Any) -> None:
        deadline = self._now() + min(wait_ms, MAX_WAIT_MS)
        if not self.long_polls.park(start, deadline, local, answer, token):
            self.answer_empty(token, start)  # too many waiting: the client asks again

    def answer_empty(self, token: Any, start: int) -> None:
        self._reply(token, RequestCode.READ, EntriesResponse(200, self.member.leader_id or "", [], start,
                                                self.store.committed_index))

    def wake(self) -> None:
        """Long-poll READs whose index committed get their entries, LONG_POLL_DRAIN_BYTES of
        answers per drain (the rest at the next drains, a tick's at the latest); those past
        their wait an empty answer (checked on every drain, and by the tick)."""
        polls = self.long_polls
        if not len(polls):
            return
        # (a leader's own parked reads all leave when it steps down: see step_down)
        spent = 0
        while spent < LONG_POLL_DRAIN_BYTES and (r := polls.pop_due(self.store.committed_index)) is not None:
            try:
                spent += r.answer()
            except DLedgerError as e:
                self._reply(r.token, RequestCode.READ, self._error(RequestCode.READ, e.code, e.message))
        for r in polls.expired(self._now()):
            self.answer_empty(r.token, r.start)

    def when_confirmed(self, code: int, consistency: str, token: Any, serve: Callable[[int], None],
                        addressed: bool = False) -> None:
        """Run `serve(read_index)` on the leader once `consistency` allows: at once for
        `leader`, after a confirming heartbeat round (or within the lease) otherwise; on a
        follower for a follower read (`addressed`) once it committed the leader's read index
        (core.follower_read). Errors raised by `serve` later become the request's answer."""
        if consistency not in CONSISTENCY or consistency == "local":
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, describe(consistency))
        follower_read = addressed and not self.member.is_leader and consistency != "leader"
        if not follower_read:
            self.check_leader()
        if self._transferring() and consistency != "leader":
            raise DLedgerError(ResponseCode.LEADER_TRANSFERRING, "leadership transfer in progress")

        def safely(read_index: int) -> None:
            try:
                serve(read_index)
            except CorruptEntryError as e:
                self._reply(token, code, self._error(code, e.code, e.message))
                self._mark_corrupt(e.index, e.message)
            except DLedgerError as e:
                self._reply(token, code, self._error(code, e.code, e.message))

        def fail(err: ResponseCode, message: str) -> None:
            self._reply(token, code, self._error(code, err, message))

        if follower_read:
            self.follower_reads.read(consistency, safely, fail)
        elif consistency == "leader":
            safely(self.store.committed_index)
        else:
            self.read_index.read(consistency, self.store.committed_index, safely, fail)

    def _answer(self, code: int, start: int, max_entries: int, max_bytes: int, only_normal: bool,
                     local: bool, token: Any, bodies: bool = True) -> int:
        """Without `bodies` every entry goes with an empty body (a reader that needs only the
        indexes and terms); the size of the bodies still bounds the answer, as the store reads them.
        Returns the bytes read (what the answer cost: a long poll's budget counts them)."""
        store = self.store
        committed = self._committed_from(start)
        out: list[EntryMsg] = []
        index = start
        size = 0
        # the member's limit, whatever the request asks: an answer is built in memory first
        max_bytes = min(max_bytes, self.cfg.max_read_bytes)
        while index <= committed and len(out) < max_entries and size < max_bytes:
            batch = self._read_good(store.read, index, min(max_entries - len(out), committed - index + 1),
                                    max_bytes - size, local, bool(out))
            if not batch:
                break
            for e in batch:
                if e.index > committed:
                    break
                index = e.index + 1
                size += len(e.body) + _ENTRY_OVERHEAD
                if e.magic == MAGIC_SESSION:  # producers' ids, epochs, sequences: never shown to clients
                    if code == RequestCode.GET:
                        raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE,
                                           f"entry {e.index} is an idempotent producer's session marker, which is "
                                           f"not returned to clients")
                    continue
                if not only_normal or e.magic == MAGIC_NORMAL:
                    out.append(EntryMsg(e.index, e.term, e.pos, e.magic, e.body if bodies else b"", e.chain_crc))
                    self.read_body_bytes += len(out[-1].body)
        self.entries_read += len(out)
        self._reply(token, code, EntriesResponse(200, self.member.leader_id or "", out, index, committed))
        return size

    def _answer_markers(self, start: int, max_entries: int, token: Any) -> int:
        """Only the committed session markers from `start` (at most `max_entries`, within
        MARKER_SCAN indexes), redacted: which entries belong to transactions, for a reader
        that must tell them apart (docs/format.md, "Transaction records"); other producers'
        ids, and every owner's name, are never shown (docs/security.md)."""
        store = self.store
        committed = self._committed_from(start)
        last = min(committed, start + MARKER_SCAN - 1)
        found = store.indexes_with_magic(start, last, MAGIC_SESSION)
        out: list[EntryMsg] = []
        size = 0
        for i in found[:max_entries]:
            e = store.get(i)
            if e.magic == MAGIC_SESSION:  # the index said so; the record must agree
                try:
                    body = redacted_marker(e.body)
                except msgspec.DecodeError:
                    continue  # unreadable (the producer table skips it too)
                out.append(EntryMsg(e.index, e.term, e.pos, e.magic, body, e.chain_crc))
                size += len(e.body) + _ENTRY_OVERHEAD
        nxt = found[max_entries - 1] + 1 if len(found) > max_entries else last + 1
        self._reply(token, RequestCode.READ, EntriesResponse(200, self.member.leader_id or "", out,
                                                             max(nxt, store.begin_index), committed))
        return size

    def _answer_columns(self, start: int, max_entries: int, max_bytes: int, local: bool, token: Any,
                        bodies: bool) -> int:
        """`_answer` for a columnar READ of NORMAL entries: the same entries, limits and
        handling of a corrupt record, as columns (LedgerStore.read_columns)."""
        store = self.store
        committed = self._committed_from(start)
        index, size, kept = start, 0, 0
        max_bytes = min(max_bytes, self.cfg.max_read_bytes)
        indexes, terms, positions, sizes, chunks = array("q"), array("q"), array("q"), array("q"), []
        while index <= committed and kept < max_entries and size < max_bytes:
            c = self._read_good(lambda at, n, cap: store.read_columns(at, n, cap, _NORMAL_ONLY, bodies),
                                index, min(max_entries - kept, committed - index + 1), max_bytes - size, local,
                                kept > 0)
            if c is None or not c.scanned:
                break
            indexes.extend(c.indexes)
            terms.extend(c.terms)
            positions.extend(c.positions)
            sizes.extend(c.body_sizes)
            chunks.extend(c.bodies)
            kept += len(c.indexes)
            size += c.size
            index = c.next_index
        from dledger.store.columnar import body_ends  # loaded by the first columnar read only

        body = b"".join(chunks)  # (one chunk: itself, no copy)
        ends = body_ends(sizes)
        self.entries_read += kept
        self.read_body_bytes += len(body)
        self._reply(token, RequestCode.READ, EntriesResponse(
            200, self.member.leader_id or "", [], index, committed, columnar=True, indexes=_little(indexes),
            terms=_little(terms), positions=_little(positions), body_ends=ends, bodies=body))
        return size

    def _read_good(self, read: Callable[[int, int, int], _R], index: int, want: int, max_bytes: int,
                   local: bool, have_some: bool) -> _R | None:
        """`read(index, want, max_bytes)`, or on a corrupt record the verified part before it; None when
        the damage is at `index` and the answer already has entries (the next read names it),
        CorruptEntryError when it has none. Both READ answers share this rule."""
        try:
            return read(index, want, max_bytes)
        except CorruptEntryError as err:
            self._hit_corrupt(err, local)
            if err.index > index:
                return read(index, err.index - index, max_bytes)
            if have_some:
                return None
            raise

    def _committed_from(self, start: int) -> int:
        """The committed index, which a read from `start` must not be beyond."""
        committed = self.store.committed_index
        if start > committed:
            raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE, f"index {start} is beyond the committed {committed}")
        return committed

    def _hit_corrupt(self, e: CorruptEntryError, local: bool) -> None:
        """A read found a committed record of ours corrupt: never serve it. A leader hands
        leadership over, and its reader is told to retry (then at the new leader, whose copy
        is good); a local reader is told our copy is damaged."""
        self._mark_corrupt(e.index, e.message)
        if local:
            return
        m = self.member
        e.code = ResponseCode.LEADER_TRANSFERRING if m.is_leader else ResponseCode.NOT_LEADER
        e.message = f"record {e.index} is corrupt on {m.self_id} ({e.message}): leadership moves to a healthy member"

    def check_leader(self) -> None:
        """A new leader knows the true commit index only once an entry of its own term is
        committed (its NOOP, Raft §8); until then it could deny an acknowledged entry."""
        m, store = self.member, self.store
        if not m.is_leader:
            raise DLedgerError(ResponseCode.NOT_LEADER, f"leader is {m.leader_id or 'unknown'}")
        if store.committed_index < 0 or store.term_at(store.committed_index) != m.term:
            raise DLedgerError(ResponseCode.LEADER_NOT_READY, f"term {m.term}: nothing of this term committed yet")

