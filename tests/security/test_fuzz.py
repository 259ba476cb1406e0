"""A hypothesis-driven fuzzer against a live 3-member group (issue 11).

Two fuzzers share one group: structured frames (every request code, fields of the wrong
type, out-of-bounds or huge integers, long or non-UTF-8 strings, wrong group and ids,
random data, lying headers) and raw random byte strings. One TCP connection per example.
Every example: no answer is INTERNAL_ERROR, and a well-formed frame gets its answer.
After each fuzzer: every member process is running and answers METADATA, the group has
one leader that takes an append, and the log holds what it held before plus that append.

What the fuzzer may legitimately change, and how the checks allow for it:
- APPEND (50001) is fuzzed too; a structurally valid one appends. Entries new since the
  fuzz started must carry our final body or a body the fuzzer sent in an APPEND, and every
  APPEND answered 200 must be in the log at the index it was given.
- Member messages (VOTE, HEART_BEAT, PUSH, a LEADERSHIP_TRANSFER hand-over) are unauthenticated
  without TLS: a well-formed one from a real member id with a current term would be obeyed, as
  it must. So these are sent from a sender the receiver must refuse (empty, itself, unknown,
  not a string) or from a real member with a stale term, which Raft refuses. Forged but valid
  member messages are test_forged_messages.py's subject.
- LEADERSHIP_TRANSFER never names a real member as transferee (a client may move leadership).
- The group runs without fault injection, so FAULT is refused.
An election the machine's load causes adds a NOOP entry (magic 2) in a higher term: allowed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dledger.codes import PushType, RequestCode, ResponseCode
from dledger.runtime.client import AsyncDLedgerClient
from dledger.runtime.transport import HEADER_SIZE, KIND_REQUEST, KIND_RESPONSE
from integration.harness import Cluster, wait_until

pytestmark = pytest.mark.integration

_HEADER = struct.Struct(">IBQiI")  # L, kind, request id, code, M
TIMEOUT = 10.0  # an answer may be slow on a loaded machine; examples normally take milliseconds
QUIET = 0.2  # raw fuzz: no byte for this long and nothing is owed: the member waits for more

FUZZ_SETTINGS = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                              HealthCheck.large_base_example],
}


# --- the group -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(3, Path(tmp_path_factory.mktemp("fuzz")), fault_injection=False)
    try:
        c.start()
        c.wait_leader()
        yield c
    finally:
        c.cleanup()


@dataclass(frozen=True)
class LogEntry:
    index: int
    term: int
    magic: int
    body: bytes


@dataclass(frozen=True)
class Snapshot:
    leader: str
    term: int
    end: int
    committed: int
    log: dict[int, LogEntry]


def read_log(c: Cluster, member: str | None = None) -> dict[int, LogEntry]:
    """Every committed entry, NOOPs included: from the leader, or `member`'s own copy."""

    async def go() -> dict[int, LogEntry]:
        async with AsyncDLedgerClient(c.peers, c.group, timeout=10.0) as client:
            entries = await client.read(0, 1 << 20, only_normal=False, member=member)
        return {e.index: LogEntry(e.index, e.term, e.magic, e.body) for e in entries}

    return asyncio.run(go())


def snapshot(c: Cluster) -> Snapshot:
    """The group at rest: every member holds and has committed the same log."""
    end = c.wait_caught_up()
    meta = c.leader_meta()
    log = read_log(c)
    for m in c.ids:
        assert read_log(c, m) == log, f"{m}'s committed log differs from the leader's"
    assert max(log, default=-1) == end
    return Snapshot(meta.self_id, meta.term, end, meta.committed_index, log)


# --- the wire -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    kind: int
    request_id: int
    code: int
    meta: bytes


def address(c: Cluster, member: str) -> tuple[str, int]:
    host, _, port = c.peer_entry(member).split("-", 1)[1].rpartition(":")
    return host, int(port)


def parse_frames(buf: bytes) -> list[Frame]:
    """The whole frames at the start of `buf`."""
    out = []
    off = 0
    while len(buf) - off >= HEADER_SIZE:
        length, kind, rid, code, mlen = _HEADER.unpack_from(buf, off)
        if len(buf) - off < 4 + length:
            break
        out.append(Frame(kind, rid, code, buf[off + HEADER_SIZE : off + HEADER_SIZE + mlen]))
        off += 4 + length
    return out


def exchange(c: Cluster, member: str, payload: bytes, until: str) -> tuple[list[Frame], bool]:
    """Send `payload` on a fresh connection and read: until an answer came ("answer"), until the
    member closes the connection ("close"), or until nothing arrived for QUIET s ("quiet"); at
    most TIMEOUT s. The frames received, and whether the member closed the connection."""
    buf = b""
    closed = False
    with socket.create_connection(address(c, member), timeout=TIMEOUT) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            s.sendall(payload)
        except (ConnectionResetError, BrokenPipeError):
            closed = True
        deadline = time.monotonic() + TIMEOUT
        while not closed and not (until == "answer" and parse_frames(buf)):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            s.settimeout(min(left, QUIET) if until == "quiet" else left)
            try:
                chunk = s.recv(1 << 20)
            except TimeoutError:
                break
            except (ConnectionResetError, BrokenPipeError):
                closed = True
                break
            if not chunk:
                closed = True
            buf += chunk
    return parse_frames(buf), closed


# --- structured examples ---------------------------------------------------------------------------


class Raw(bytes):
    """Already-encoded msgpack, spliced into a message as it is (e.g. a str that is not UTF-8)."""


def encode_value(v: Any) -> bytes:
    if isinstance(v, Raw):
        return bytes(v)
    return encode_array(v) if isinstance(v, list) else msgspec.msgpack.encode(v)


def encode_array(values: list[Any]) -> bytes:
    n = len(values)
    head = bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big")
    return head + b"".join(encode_value(v) for v in values)


def not_utf8() -> st.SearchStrategy[Raw]:
    bad = st.sampled_from([b"\xff", b"\xc3\x28", b"\xa0\xa1", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"n\xfe0"])
    return st.builds(lambda b: Raw(bytes([0xA0 | len(b)]) + b), bad)


def wrong_type() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=8), st.binary(max_size=8),
        st.lists(st.integers(-5, 5), max_size=3),
        st.dictionaries(st.text(max_size=3), st.integers(-(2**63), 2**64 - 1), max_size=2),
        not_utf8(),
    )


# integers a field of its type takes (terms, indexes and counts), and any a msgpack int can be
sane_ints = st.one_of(st.integers(-1, 50), st.integers(0, 2**31 - 1), st.sampled_from([2**31 - 1, 2**62 - 1]))
ints = st.one_of(
    st.integers(-3, 50),
    st.sampled_from([2**31 - 1, 2**31, 2**32, 2**62 - 1, 2**62, 2**63 - 1, 2**64 - 1, -(2**31), -(2**63)]),
    st.integers(-(2**63), 2**64 - 1),
)


@dataclass
class Context:
    """What the strategies need to know about the group."""

    group: str
    ids: list[str]
    term: int  # the group's term when fuzzing began: below it is stale


@dataclass
class Example:
    target: str
    code: int
    meta: bytes
    data: bytes
    kind: int = KIND_REQUEST
    framing: str = "ok"  # ok | lying-meta-length | truncated
    bodies: list[bytes] = field(default_factory=list)  # an APPEND's bodies (decoded or not)

    @property
    def wire(self) -> bytes:
        meta, data = self.meta, self.data
        mlen = len(meta)
        if self.framing == "lying-meta-length":
            mlen = len(meta) + len(data) + 1
        frame = _HEADER.pack(17 + len(meta) + len(data), self.kind, 7, self.code, mlen) + meta + data
        return frame[: max(1, len(frame) // 2)] if self.framing == "truncated" else frame

    @property
    def well_formed(self) -> bool:
        return self.framing == "ok" and self.kind == KIND_REQUEST


MEMBER_CODES = frozenset((RequestCode.VOTE, RequestCode.HEART_BEAT, RequestCode.PUSH, RequestCode.LEADERSHIP_TRANSFER))


# the kinds of each request's fields after (group, sender, receiver), in wire order
SCHEMAS: dict[int, list[str]] = {
    RequestCode.METADATA: [],
    RequestCode.APPEND: ["bodies"],
    RequestCode.GET: ["index", "bool"],
    RequestCode.READ: ["index", "count", "count", "bool", "bool"],
    RequestCode.VOTE: ["term", "index", "term", "bool", "bool"],
    RequestCode.HEART_BEAT: ["term", "index", "index", "name"],
    RequestCode.PUSH: ["term", "pushtype", "index", "term", "index", "count", "index", "term"],
    RequestCode.LEADERSHIP_TRANSFER: ["term", "transfer", "transferee"],
    RequestCode.FAULT: ["names"],
}
OTHER_CODES = [RequestCode.PULL, RequestCode.INSTALL_SNAPSHOT, RequestCode.USER_DEFINE_REQUEST, RequestCode.AUTH, 0, -1]


@st.composite
def structured(draw: st.DrawFn, ctx: Context) -> Example:
    target = draw(st.sampled_from(ctx.ids))
    others = [m for m in ctx.ids if m != target]
    pick = draw(st.integers(0, 9))  # mostly the codes a member knows
    code = draw(st.integers(-(2**31), 2**31 - 1) if pick == 0 else st.sampled_from(OTHER_CODES) if pick == 1
                else st.sampled_from(sorted(SCHEMAS)))
    schema = SCHEMAS.get(code, draw(st.lists(st.sampled_from(["index", "name", "bool"]), max_size=4)))
    # never a real member id, but the receiver's own
    bad_name = st.one_of(st.just(""), st.just(target), st.text(max_size=12), st.text(min_size=129, max_size=300),
                         not_utf8(), wrong_type()).filter(lambda v: v == target or v not in ctx.ids)
    member_msg = code in MEMBER_CODES  # (a LEADERSHIP_TRANSFER is one when it names a transfer_id)
    # a member message comes from a sender the receiver must refuse, or from a real member in a stale term
    stale = member_msg and draw(st.booleans())
    stale_term = st.integers(-1, ctx.term - 1)
    mutated = draw(st.integers(0, 2)) == 0  # a third of the examples carry fields of the wrong type

    def mostly(usual: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> Any:
        return draw(odd if draw(st.integers(0, 4)) == 0 else usual)

    def value(kind: str) -> Any:
        if kind == "transferee":  # never a real member: a valid transfer would move leadership
            return draw(bad_name)
        if mutated and kind != "bodies" and draw(st.integers(0, 3)) == 0:
            return draw(wrong_type())
        if kind in ("index", "count"):
            return draw(ints if mutated else sane_ints)
        if kind == "term":
            return draw(stale_term) if stale else draw(ints if mutated else sane_ints)
        if kind == "bool":
            return draw(st.booleans())
        if kind == "pushtype":
            return draw(st.one_of(st.sampled_from([int(t) for t in PushType]), ints if mutated else sane_ints))
        if kind == "name":
            return draw(st.one_of(st.sampled_from(ctx.ids), bad_name))
        if kind == "transfer":  # non-empty: a leader's hand-over, a member message
            return draw(st.one_of(st.just(""), st.sampled_from(ctx.ids), bad_name))
        if kind == "names":
            return draw(st.lists(st.one_of(st.sampled_from(ctx.ids), bad_name), max_size=4))
        assert kind == "bodies"
        good = st.lists(st.binary(max_size=64), min_size=1, max_size=8)
        return mostly(good, st.one_of(st.just([]), st.lists(st.text(max_size=8), min_size=1, max_size=3),
                                      wrong_type()))

    group_value = mostly(st.just(ctx.group), bad_name)
    if member_msg:
        sender = draw(st.sampled_from(others)) if stale else draw(bad_name)
    else:
        sender = mostly(st.sampled_from(["", *ctx.ids]), bad_name)
    receiver = mostly(st.sampled_from(["", target]), st.one_of(st.sampled_from(ctx.ids), bad_name))
    values: list[Any] = [group_value, sender, receiver, *[value(k) for k in schema]]
    if code == RequestCode.LEADERSHIP_TRANSFER and stale and values[4] == "":
        values[4] = values[1]  # a hand-over (member message): from the stale sender
    shape = draw(st.sampled_from(["ok"] * 8 + ["truncated", "extra", "dict", "random"]))
    if shape == "truncated":
        values = values[: draw(st.integers(0, len(values)))]
    elif shape == "extra":
        values += draw(st.lists(wrong_type(), min_size=1, max_size=3))
    if shape == "dict":
        meta = msgspec.msgpack.encode({"group": ctx.group, "x": draw(ints)})
    elif shape == "random":
        meta = draw(st.binary(max_size=64))
    else:
        meta = encode_array(values)
    data = draw(st.one_of(st.just(b""), st.just(b""), st.binary(max_size=300)))
    kind = draw(st.sampled_from([KIND_REQUEST] * 19 + [KIND_RESPONSE]))
    framing = draw(st.sampled_from(["ok"] * 18 + ["lying-meta-length", "truncated"]))
    bodies: list[bytes] = []
    if code == RequestCode.APPEND and len(values) > 3 and isinstance(values[3], list):
        bodies = [b if isinstance(b, bytes) else str(b).encode() for b in values[3]]
    return Example(target, code, meta, data, kind, framing, bodies)


# --- raw examples ------------------------------------------------------------------------------------


@st.composite
def raw_bytes(draw: st.DrawFn, ctx: Context) -> tuple[str, bytes]:
    target = draw(st.sampled_from(ctx.ids))
    rest = draw(st.binary(max_size=512))
    shape = draw(st.sampled_from(["random", "framed", "header", "after-valid"]))
    if shape == "random":
        payload = rest
    elif shape == "framed":  # a length that matches: the rest is read as kind, id, code, M, meta, data
        payload = struct.pack(">I", len(rest)) + rest
    elif shape == "header":  # a plausible header, random meta and data
        mlen = draw(st.integers(0, len(rest)))
        code = draw(st.one_of(st.sampled_from([*SCHEMAS, *OTHER_CODES]), st.integers(-(2**31), 2**31 - 1)))
        payload = _HEADER.pack(17 + len(rest), KIND_REQUEST, 9, code, mlen) + rest
    else:
        meta = msgspec.msgpack.encode([ctx.group, "", ""])
        payload = _HEADER.pack(17 + len(meta), KIND_REQUEST, 9, RequestCode.METADATA, len(meta)) + meta + rest
    return target, payload


# --- the checks -----------------------------------------------------------------------------------------


@dataclass
class Record:
    codes: collections.Counter[int] = field(default_factory=collections.Counter)
    append_bodies: set[bytes] = field(default_factory=set)
    appended: dict[int, list[bytes]] = field(default_factory=dict)  # answered 200: first index -> bodies


def no_internal_error(frames: list[Frame], what: object) -> None:
    for f in frames:
        assert f.code != ResponseCode.INTERNAL_ERROR, f"INTERNAL_ERROR {msgspec.msgpack.decode(f.meta)!r} for {what!r}"


def check_after(c: Cluster, before: Snapshot, rec: Record) -> None:
    for m, p in c.procs.items():
        assert p.poll() is None, f"{m} exited with code {p.returncode}"
    for m in c.ids:
        wait_until(functools.partial(c.meta, m), 30, f"{m} answers METADATA")
    leader = c.wait_leader()
    body = f"after the fuzz, term {before.term}, end {before.end}".encode()
    r = c.ctl.append(body)
    assert c.ctl.get(r.index).body == body
    after = snapshot(c)
    assert after.leader == leader
    lost = {i: e for i, e in before.log.items() if after.log.get(i) != e}
    assert not lost, f"entries changed by the fuzz: {[(e, after.log.get(i)) for i, e in list(lost.items())[:5]]}"
    for i in range(before.end + 1, after.end + 1):
        e = after.log[i]
        if e.magic == 2:  # a NOOP: only an election in a later term writes one
            assert e.term > before.term and e.body == b"", f"unexpected NOOP {e}"
        elif i == r.index:
            assert e.body == body
        else:
            assert e.body in rec.append_bodies, f"entry {e} was not sent in an APPEND by the fuzzer"
    for first, bodies in rec.appended.items():
        got = [after.log[first + k].body if first + k in after.log else None for k in range(len(bodies))]
        assert got == bodies, f"APPEND answered 200 at {first} holds {got!r}, sent {bodies!r}"
    assert after.committed == after.end


def context(c: Cluster) -> tuple[Context, Snapshot]:
    before = snapshot(c)
    return Context(c.group, list(c.ids), before.term), before


# --- the fuzzers --------------------------------------------------------------------------------------


def test_structured_fuzz_leaves_the_group_serving_and_its_log_intact(group: Cluster) -> None:
    c = group
    ctx, before = context(c)
    rec = Record()

    @settings(max_examples=300, **FUZZ_SETTINGS)  # type: ignore[arg-type]
    @given(structured(ctx))
    def run(ex: Example) -> None:
        until = "answer" if ex.well_formed else "quiet" if ex.framing == "truncated" else "close"
        frames, closed = exchange(c, ex.target, ex.wire, until)
        no_internal_error(frames, ex)
        if ex.code == RequestCode.APPEND:
            rec.append_bodies.update(ex.bodies)
        if not ex.well_formed:
            # a lying header or a response sent to a server: dropped, never answered
            assert ex.framing == "truncated" or closed, f"connection kept after a malformed frame: {ex!r}"
            assert ex.framing == "truncated" or not frames, f"a malformed frame was answered: {frames!r}"
            return
        assert len(frames) == 1, f"no answer (closed: {closed}) to {ex!r}"
        f = frames[0]
        assert (f.kind, f.request_id) == (KIND_RESPONSE, 7), f
        rec.codes[f.code] += 1
        if ex.code == RequestCode.APPEND and f.code == ResponseCode.SUCCESS:
            answer = msgspec.msgpack.decode(f.meta)
            rec.appended[answer[3]] = ex.bodies

    run()
    print('CODES', sorted(rec.codes.items()), len(rec.appended), len(rec.append_bodies))
    seen = set(rec.codes)
    for want in (ResponseCode.SUCCESS, ResponseCode.UNEXPECTED_ARGUMENT, ResponseCode.UNKNOWN_GROUP):
        assert want in seen, f"the fuzzer never reached {want.name}: answers {rec.codes}"
    check_after(c, before, rec)


def test_raw_fuzz_leaves_the_group_serving_and_its_log_intact(group: Cluster) -> None:
    c = group
    ctx, before = context(c)
    rec = Record()

    @settings(max_examples=200, **FUZZ_SETTINGS)  # type: ignore[arg-type]
    @given(raw_bytes(ctx))
    def run(example: tuple[str, bytes]) -> None:
        target, payload = example
        with contextlib.suppress(ConnectionRefusedError):
            frames, _ = exchange(c, target, payload, "quiet")
            no_internal_error(frames, payload)
            for f in frames:
                rec.codes[f.code] += 1
        assert c.procs[target].poll() is None, f"{target} exited after {payload!r}"

    run()
    check_after(c, before, rec)
