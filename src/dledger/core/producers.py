"""Idempotent producers: exactly-once appends across retries and leader changes.

Raft thesis §6.3 (client sessions) and Kafka's idempotent producer. A producer (an id the
client chooses) numbers its bodies 0, 1, 2, … A leader store write that holds idempotent
appends is a session marker (MAGIC_SESSION) followed by the write's NORMAL entries; the
marker's runs say which producer and sequence numbers those entries carry, in order.

The producer table (per producer: the last sequence in the log and where its entries are)
is a function of the committed log: every member folds committed markers into it (`fold`),
so a new leader knows every producer without being told, and snapshots carry it (`encode` /
`decode`).

Where the entries are: spans (first sequence, first index, count), every span of the
producer's current epoch, so any duplicate can be compared with the stored entry (a retried
Spark task sends its whole partition again from sequence 0). The table holds at most
`max_spans` of them: beyond, at fold time, the least recently used producers keep only their
epoch's first span and the SPANS most recent (the same ones on every member, at the same log
position). A duplicate whose place is not kept, or whose entry is deleted (retention, a
snapshot), cannot be compared, so it is refused (DUPLICATE_UNVERIFIABLE), never answered.

Partial writes: a leader crash may leave only a prefix of a write in the next leader's log
(Raft truncates suffixes). A marker's entries are those right after it that still carry its
term, up to its run total (terms never decrease along a log, and a new leader's first entry
has a higher term); the table counts exactly those, so a retry of the whole batch is answered
with the surviving prefix's indexes and appends only the rest.

The leader's own appends not committed yet live in an overlay (its log only grows while it
leads). It takes idempotent appends only once every entry of earlier terms is committed and
folded (its NOOP committed): overlay over table is then its whole log.

Epochs (Kafka's producer epoch): a producer's session may be restarted under a higher
epoch, its sequences from 0 again, and an append of a lower epoch than the table's is
refused (PRODUCER_FENCED): a streaming query is one producer per partition, its epoch the
micro-batch, so the table holds one entry per partition, not per batch.

Ownership: a producer belongs to the principal (certificate or token name, "" anonymous)
whose append created it; each run of a marker names its appender (`Run.owner`), so every
member knows the owner. The leader refuses another principal's append under the id
(PRODUCER_NOT_OWNED), and the node refuses a duplicate whose body is not the stored one
(SEQUENCE_REUSED: the spans kept include the epoch's first, so a process reusing an id from
sequence 0 is caught at once, whatever was trimmed). At most `max_per_owner` producers per owner (its least
recently used evicted, on every member alike), and the leader bounds creations per principal
(`CreationLimiter`): one client cannot evict the others' producers.
"""

from __future__ import annotations

import hashlib
import logging
from array import array
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from dledger.codes import DLedgerError, ResponseCode
from dledger.entry import MAGIC_SESSION
from dledger.store.base import LedgerStore

log = logging.getLogger(__name__)

SPANS = 32  # recent spans a producer keeps, besides its epoch's first, when the table is over its span budget
FOLD_CHUNK = 1 << 20  # entries folded per call: a long log (a restart) is folded over several drains,
FOLD_MARKERS = 10_000  # and at most this many markers (~10 us each)

ProducerId = Annotated[str, msgspec.Meta(max_length=128)]


class Run(msgspec.Struct, array_like=True, frozen=True):
    """`count` entries of `producer` (in `epoch`) from sequence `first_seq` ("": not an
    idempotent append)."""

    producer: ProducerId
    first_seq: int
    count: int
    epoch: int = 0
    owner: str = ""  # the appender's principal; "" anonymous (and every run of older markers)


def _wire(r: Run) -> tuple[str, int, int, int] | tuple[str, int, int, int, str]:
    """A run as written: without an owner exactly as before owners existed (the same bytes)."""
    if r.owner:
        return r.producer, r.first_seq, r.count, r.epoch, r.owner
    return r.producer, r.first_seq, r.count, r.epoch


class SessionMarker(msgspec.Struct, array_like=True, frozen=True):
    ts_ms: int  # the leader's wall clock: producers idle longer than the expiry are dropped
    runs: list[Run]

    @property
    def total(self) -> int:
        return sum(r.count for r in self.runs)


_encode_marker = msgspec.msgpack.Encoder().encode
_decode_marker = msgspec.msgpack.Decoder(SessionMarker).decode


def marker_body(ts_ms: int, runs: list[Run]) -> bytes:
    return _encode_marker((ts_ms, [_wire(r) for r in runs]))


# producer ids of transactions (a transactional Spark write, docs/format.md "Transaction
# records"): the only ids a markers-only READ shows
TRANSACTIONAL_PREFIX = "txn:"


def redacted_marker(body: bytes) -> bytes:
    """A marker as a markers-only READ shows it: every run's count (which entries it covers);
    for a transaction's producer its id, sequence and epoch, and its owner as a digest (equal
    owners, equal digests: a reader can tell a commit record from a forged one without
    learning the name); for any other producer nothing (ids stay their principals')."""
    m = _decode_marker(body)
    runs = [Run(r.producer, r.first_seq, r.count, r.epoch, owner_digest(r.owner))
            if r.producer.startswith(TRANSACTIONAL_PREFIX) else Run("", 0, r.count) for r in m.runs]
    return marker_body(m.ts_ms, runs)


def owner_digest(owner: str) -> str:
    return hashlib.sha256(owner.encode()).hexdigest()[:32] if owner else ""


class Producer:
    """One producer's place in the log: its owner, epoch, last sequence, and its entries'
    indexes (spans: first_seq, first_index, count, flat in one array: 24 bytes each, in
    sequence order): every span of the epoch, unless the table trimmed them (`trim`)."""

    __slots__ = ("epoch", "gap", "last_seq", "owner", "spans", "ts_ms")

    def __init__(self, last_seq: int = -1, ts_ms: int = 0, spans: array[int] | None = None, epoch: int = 0,
                 owner: str = "", gap: bool = False) -> None:
        self.epoch = epoch
        self.last_seq = last_seq
        self.ts_ms = ts_ms
        self.spans: array[int] = spans if spans is not None else array("q")
        self.owner = owner
        # entries of this producer may lie in a stretch of log this table never folded (a table
        # folded short of the log begin): its last_seq is only a lower bound until it appends again
        self.gap = gap

    @property
    def last_index(self) -> int:
        s = self.spans
        return s[-2] + s[-1] - 1 if s else -1

    @property
    def span_count(self) -> int:
        return len(self.spans) // 3

    def copy(self, after: int = -1) -> Producer:
        """A copy with the spans that end after index `after` (at least the last): the leader's
        plan needs only those its committed table (folded through `after`) does not hold, and
        copying every span of a long epoch at every write would cost as much as the epoch."""
        s, k = self.spans, len(self.spans) - 3
        while k > 0 and s[k - 2] + s[k - 1] - 1 > after:
            k -= 3
        return Producer(self.last_seq, self.ts_ms, s[max(k, 0):], self.epoch, self.owner, self.gap)

    def index_of(self, seq: int) -> int:
        """The index of sequence `seq`, or -1 when its place is not kept."""
        return self.indexes(seq, 1)[0]

    def indexes(self, first: int, n: int) -> list[int]:
        """The indexes of sequences first .. first + n - 1 (-1 where not kept): one binary
        search, then span by span (a retry of a whole partition asks for thousands)."""
        s, seq, end = self.spans, first, first + n
        out: list[int] = []
        k = self._span_at(first)
        while seq < end:
            while k + 3 < len(s) and s[k + 3] <= seq:
                k += 3
            if k >= 0 and seq < s[k] + s[k + 2]:
                stop, base = min(end, s[k] + s[k + 2]), s[k + 1] - s[k]
                out.extend(range(base + seq, base + stop))
            else:
                stop = min(end, s[k + 3]) if k + 3 < len(s) else end
                out.extend([-1] * (stop - seq))
            seq = stop
        return out

    def _span_at(self, seq: int) -> int:
        """The offset of the last span starting at or before `seq` (-3: none)."""
        s, lo, hi = self.spans, 0, len(self.spans) // 3
        while lo < hi:
            mid = (lo + hi) // 2
            if s[3 * mid] <= seq:
                lo = mid + 1
            else:
                hi = mid
        return 3 * (lo - 1)

    def add(self, seq: int, index: int, count: int, ts_ms: int, epoch: int = 0) -> None:
        if epoch > self.epoch:  # a new session of this producer: its sequences start again
            self.epoch, self.last_seq, self.gap = epoch, -1, False
            del self.spans[:]
        if self.gap:  # its first entry after the stretch never folded: the log's word holds again
            self.gap = False
        elif seq != self.last_seq + 1:  # the leader checks this before writing: a log that says otherwise is old
            log.warning("producer sequence %d follows %d in the log", seq, self.last_seq)
            self._cut(seq)
        s = self.spans
        if s and s[-3] + s[-1] == seq and s[-2] + s[-1] == index:
            s[-1] += count  # contiguous in sequence and in the log: one span
        else:
            s.extend((seq, index, count))
        self.last_seq = seq + count - 1
        self.ts_ms = max(self.ts_ms, ts_ms)

    def _cut(self, seq: int) -> None:
        """Forget the spans from `seq` on (a log that numbers a sequence again: its newest word
        holds), so the spans stay in sequence order for the binary search."""
        s = self.spans
        while s and s[-3] + s[-1] > seq:
            if s[-3] >= seq:
                del s[-3:]
            else:
                s[-1] = seq - s[-3]
                break

    def trim(self) -> int:
        """Keep only the epoch's first span (a reuse from sequence 0 is found there) and the
        SPANS most recent; the number of spans dropped."""
        s = self.spans
        drop = len(s) - 3 * (SPANS + 1)
        if drop <= 0:
            return 0
        del s[3 : 3 + drop]
        return drop // 3


@dataclass(slots=True)
class _OpenRun:
    """A folded marker whose entries are not all folded yet (committed later, or cut short)."""

    index: int  # the marker's
    term: int
    marker: SessionMarker
    next: int  # the next entry to fold

    @property
    def end(self) -> int:
        return self.index + self.marker.total


class _SavedProducer(msgspec.Struct, array_like=True):
    """A producer in a snapshot (older snapshots have no owner: "")."""

    id: str
    last_seq: int
    ts_ms: int
    spans: list[int]  # flat
    epoch: int
    owner: str = ""
    gap: bool = False  # Producer.gap (older snapshots: none)


class _Saved(msgspec.Struct, array_like=True):
    folded: int
    open: tuple[int, int, int, SessionMarker] | None
    producers: list[_SavedProducer]  # least recently used first


@dataclass(slots=True)
class Decision:
    """How a leader handles one idempotent append: the first `duplicates` bodies are in the
    log already (at `indexes`); the rest go in."""

    duplicates: int
    indexes: list[int] = field(default_factory=list)
    wait_index: int = -1  # the answer waits until this index is committed


def unverifiable(producer: str, seq: int, why: str) -> DLedgerError:
    """DUPLICATE_UNVERIFIABLE: answering an entry that may not be this body would lose it."""
    return DLedgerError(ResponseCode.DUPLICATE_UNVERIFIABLE,
                        f"sequence {seq} of producer {producer!r} is in the log already, but cannot be compared "
                        f"with the stored entry ({why}): nothing was written, and sending it again will not help; "
                        f"send new bodies in a new epoch or under another id")


class ProducerTable:
    def __init__(self, expiry_ms: int, max_producers: int, folded: int = -1, max_per_owner: int = 50_000,
                 max_spans: int = 1_000_000) -> None:
        self.expiry_ms = expiry_ms
        self.max_producers = max_producers
        self.max_per_owner = max_per_owner
        self.max_spans = max_spans
        self.producers: OrderedDict[str, Producer] = OrderedDict()  # committed; least recently used first
        self.owned: dict[str, OrderedDict[str, None]] = {}  # owner -> its producers, in the same order
        self.span_count = 0  # the committed producers' spans: the budget check is O(1)
        self.long: OrderedDict[str, None] = OrderedDict()  # producers with spans to trim, in the same order
        self.folded = folded  # the committed log is folded through this index
        self.open: _OpenRun | None = None
        self.overlay: dict[str, Producer] = {}  # a leader's own appends, not committed yet

    # --- the leader ------------------------------------------------------------------------

    def lookup(self, producer: str) -> Producer | None:
        return self.overlay.get(producer) or self.producers.get(producer)

    def decide(self, view: Producer | None, producer: str, first_seq: int, n: int, epoch: int = 0,
               principal: str = "") -> Decision:
        """Check an append of `n` bodies from `first_seq` (in `epoch`, by `principal`) against
        `view` (the producer as the log holds it, with the writes planned before this one);
        DLedgerError when refused. Another principal's id is refused first: it learns nothing.
        A duplicate whose place is not kept cannot be compared, so it is refused too."""
        if view is not None and view.owner != principal:
            raise DLedgerError(ResponseCode.PRODUCER_NOT_OWNED,
                               f"producer {producer!r} belongs to another principal: use an id of your own")
        if view is not None and epoch < view.epoch:
            raise DLedgerError(ResponseCode.PRODUCER_FENCED,
                               f"producer {producer!r}: epoch {epoch} is older than {view.epoch} (a newer "
                               f"session of this producer took over)")
        if view is None or epoch > view.epoch:
            if first_seq != 0:
                raise DLedgerError(ResponseCode.UNKNOWN_PRODUCER,
                                   f"producer {producer!r} epoch {epoch} is unknown here (new, a new epoch, or "
                                   f"expired after being idle): its first sequence must be 0, not {first_seq}")
            return Decision(0)
        if view.gap and first_seq + n - 1 > view.last_seq:  # bodies past what the table knows
            raise unverifiable(producer, max(first_seq, view.last_seq + 1),
                               "this member's producer table was installed folded short of its log begin: "
                               "the producer's entries in between are unknown here")
        if first_seq > view.last_seq + 1:
            raise DLedgerError(ResponseCode.OUT_OF_ORDER_SEQUENCE,
                               f"producer {producer!r}: sequence {first_seq} does not follow {view.last_seq} "
                               f"(an earlier append of this producer is missing)")
        dup = min(n, view.last_seq - first_seq + 1)
        if dup <= 0:
            return Decision(0)
        indexes = self._indexes(view, producer, first_seq, dup)
        if -1 in indexes:
            raise unverifiable(producer, first_seq + indexes.index(-1),
                               "its place is no longer kept: beyond max_producer_spans, or forgotten")
        return Decision(dup, indexes, max(indexes))

    def _indexes(self, view: Producer, producer: str, first: int, n: int) -> list[int]:
        """Where `view` puts sequences first.. ; a view of the leader's plan holds only what is
        not folded yet, the committed producer (of the same epoch) the rest."""
        out = view.indexes(first, n)
        base = self.producers.get(producer)
        if -1 in out and base is not None and base is not view and base.epoch == view.epoch:
            out = [i if i >= 0 else j for i, j in zip(out, base.indexes(first, n), strict=True)]
        return out

    def note_own(self, written: Iterable[tuple[str, Producer]]) -> None:
        """The leader wrote these producers' entries (views planned by `decide` and updated)."""
        self.overlay.update(written)

    def drop_overlay(self) -> None:
        """Leadership ended: what it had not committed is the next leader's to say."""
        self.overlay.clear()

    # --- every member: folding the committed log ---------------------------------------------

    def fold(self, store: LedgerStore, upto: int) -> bool:
        """Fold committed entries through `upto` (at most FOLD_CHUNK of them); whether done."""
        if self.folded < store.begin_index - 1:
            # (a snapshot written before its label was capped at the table's fold): the markers
            # between are gone; a producer we know may have appended there, so its appends past
            # what we know are refused as unverifiable, never taken as new, until it appends again
            log.warning("producer table folded through %d, the log begins at %d: producers first seen in the "
                        "entries between are forgotten; appends of the %d known past their last sequence are "
                        "refused as unverifiable until the log shows them again", self.folded,
                        store.begin_index, len(self.producers))
            for p in self.producers.values():
                p.gap = True
            self.folded, self.open = store.begin_index - 1, None
        hi = min(upto, self.folded + FOLD_CHUNK)
        if hi <= self.folded:
            return True
        markers = store.indexes_with_magic(self.folded + 1, hi, MAGIC_SESSION)
        if len(markers) > FOLD_MARKERS:
            hi, markers = markers[FOLD_MARKERS] - 1, markers[:FOLD_MARKERS]
        for m in markers:
            self._advance(store, m - 1)
            entry = store.get(m)
            if entry.magic != MAGIC_SESSION:
                continue  # the index said so, the record does not: not a marker
            try:
                marker = _decode_marker(entry.body)
            except msgspec.DecodeError as e:
                log.error("session marker at %d is unreadable (%s): skipped", m, e)
                continue
            self._expire(marker.ts_ms)  # at markers only: the same log positions on every member
            self.open = _OpenRun(m, entry.term, marker, m + 1)
        self._advance(store, hi)
        self.folded = hi
        for pid in [p for p, v in self.overlay.items() if v.last_index <= hi]:
            del self.overlay[pid]
        return hi >= upto

    def _advance(self, store: LedgerStore, lim: int) -> None:
        """Fold the open run's entries through `lim` (those still carrying its term)."""
        run = self.open
        if run is None:
            return
        lim = min(lim, run.end)
        if lim < run.next:
            return
        last, cut = lim, False
        if store.term_at(lim) != run.term:  # cut short by a later leader: find where
            lo, hi = run.next - 1, lim  # term_at(lo) == run.term
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if store.term_at(mid) == run.term:
                    lo = mid
                else:
                    hi = mid
            last, cut = lo, True
        self._credit(run, run.next, last)
        run.next = last + 1
        if cut or last == run.end:
            self.open = None

    def _credit(self, run: _OpenRun, a: int, b: int) -> None:
        """Entries a..b of `run` are in the committed log: their producers move on."""
        base, off = run.index + 1, 0
        for r in run.marker.runs:
            s0, s1 = max(off, a - base), min(off + r.count, b - base + 1)
            if s0 < s1 and r.producer:
                p = self.producers.get(r.producer)
                if p is None:
                    p = self._create(r.producer, r.owner)
                else:
                    self._touch(r.producer, p)
                self._add(r.producer, p, r.first_seq + s0 - off, base + s0, s1 - s0, run.marker.ts_ms, r.epoch)
            off += r.count

    def _add(self, pid: str, p: Producer, seq: int, index: int, count: int, ts_ms: int, epoch: int) -> None:
        """Credit entries to `p` (just touched: the most recent), then keep the span budget."""
        before = p.span_count
        p.add(seq, index, count, ts_ms, epoch)
        self.span_count += p.span_count - before
        if p.span_count > SPANS + 1:
            self.long[pid] = None  # new here, or moved to the end already by the touch
        else:
            self.long.pop(pid, None)  # a new epoch
        if self.span_count > self.max_spans:
            self._trim()

    def _trim(self) -> None:
        """Over the span budget: the least recently used producers with spans to spare keep
        only their epoch's first and the SPANS most recent, in table order, until within it
        (each producer keeps those whatever the budget)."""
        while self.span_count > self.max_spans and self.long:
            pid, _ = self.long.popitem(last=False)
            self.span_count -= self.producers[pid].trim()

    def _create(self, pid: str, owner: str) -> Producer:
        """A new producer of `owner`; at its cap, or with the table full, that owner's least
        recently used goes (at the same entry on every member), so one principal's flood evicts
        only its own. Only an owner that holds none may take the place of another's (the
        biggest holder's least recently used): a flood evicts at most one of anyone else's."""
        mine = self.owned.get(owner)
        if mine is not None and (len(mine) >= self.max_per_owner or len(self.producers) >= self.max_producers):
            self._drop(next(iter(mine)))
        p = self.producers[pid] = Producer(owner=owner)
        self.owned.setdefault(owner, OrderedDict())[pid] = None
        return p

    def _touch(self, pid: str, p: Producer) -> None:
        self.producers.move_to_end(pid)
        self.owned[p.owner].move_to_end(pid)
        if pid in self.long:
            self.long.move_to_end(pid)

    def _drop(self, pid: str) -> None:
        p = self.producers.pop(pid)
        self.span_count -= p.span_count
        self.long.pop(pid, None)
        mine = self.owned[p.owner]
        del mine[pid]
        if not mine:
            del self.owned[p.owner]

    def _expire(self, now_ms: int) -> None:
        """Drop producers idle longer than the expiry (by the log's own clock, so every member
        drops the same ones); beyond max_producers (a snapshot's table, or a new owner's first
        producer), the least recently used of the owner that holds the most (ties: the greatest
        name)."""
        cutoff = now_ms - self.expiry_ms
        ps = self.producers
        while ps:
            pid, p = next(iter(ps.items()))
            if p.ts_ms >= cutoff:
                break
            self._drop(pid)
        while len(ps) > self.max_producers:
            owner = max(self.owned, key=lambda o: (len(self.owned[o]), o))
            self._drop(next(iter(self.owned[owner])))

    @property
    def empty(self) -> bool:
        """Nothing to carry in a snapshot (snapshots then have no producer file)."""
        return not self.producers and self.open is None

    def clear(self, folded: int) -> None:
        """The committed table becomes an empty one folded through `folded`."""
        self.producers.clear()
        self.owned.clear()
        self.long.clear()
        self.span_count = 0
        self.folded, self.open = folded, None

    def skip_to(self, index: int) -> None:
        """The log now begins after `index` (a plain log's installed snapshot): entries before
        it will never be folded here."""
        if index > self.folded:
            self.folded, self.open = index, None

    # --- snapshots ---------------------------------------------------------------------------

    def encode(self) -> bytes:
        o = self.open
        saved = _Saved(self.folded, (o.index, o.term, o.next, o.marker) if o is not None else None,
                       [_SavedProducer(pid, p.last_seq, p.ts_ms, p.spans.tolist(), p.epoch, p.owner, p.gap)
                        for pid, p in self.producers.items()])
        return msgspec.msgpack.encode(saved)

    def load(self, data: bytes) -> None:
        """Replace the committed table with a snapshot's (the overlay stays: the leader's own)."""
        saved = msgspec.msgpack.decode(data, type=_Saved)
        self.folded = saved.folded
        self.open = _OpenRun(saved.open[0], saved.open[1], saved.open[3], saved.open[2]) if saved.open else None
        self.producers = OrderedDict((s.id, Producer(s.last_seq, s.ts_ms, array("q", s.spans), s.epoch, s.owner,
                                                     s.gap)) for s in saved.producers)
        self.owned, self.long, self.span_count = {}, OrderedDict(), 0
        for pid, p in self.producers.items():
            self.owned.setdefault(p.owner, OrderedDict())[pid] = None
            self.span_count += p.span_count
            if p.span_count > SPANS + 1:
                self.long[pid] = None


class CreationLimiter:
    """The leader's bound on producer creation per principal: a token bucket each (`per_second`,
    up to `burst`), by the node's clock, in memory. Without it one client creating producers
    as fast as it can pushes everyone's out of the table (max_producers)."""

    PRUNE_AT = 1024  # buckets kept before full ones (which say nothing) are dropped

    def __init__(self, per_second: int, burst: int) -> None:
        self.per_second = per_second
        self.burst = burst
        self._buckets: dict[str, tuple[float, int]] = {}  # principal -> (tokens, at ms)
        self._prune_at = self.PRUNE_AT

    def available(self, principal: str, now_ms: int) -> float:
        """Creations `principal` may make now."""
        tokens, at = self._buckets.get(principal, (float(self.burst), now_ms))
        return min(float(self.burst), tokens + max(0, now_ms - at) * self.per_second / 1000)

    def check(self, principal: str, count: int, now_ms: int) -> None:
        """Refuse (PRODUCER_RATE_LIMITED) when `count` creations exceed what `principal` may make."""
        if self.available(principal, now_ms) < count:
            raise DLedgerError(ResponseCode.PRODUCER_RATE_LIMITED,
                               f"producers are created at most {self.per_second} per second per principal "
                               f"(bursts of {self.burst}): nothing was written, send it again shortly")

    def spend(self, principal: str, count: int, now_ms: int) -> None:
        self._buckets[principal] = (self.available(principal, now_ms) - count, now_ms)
        if len(self._buckets) >= self._prune_at:
            for p in [p for p in self._buckets if self.available(p, now_ms) >= self.burst]:
                del self._buckets[p]
            self._prune_at = max(self.PRUNE_AT, 2 * len(self._buckets))
