"""Resource exhaustion by hostile clients, against real member processes (issue 11).

Each test replays one observed attack over raw sockets and the wire format (see the
docstring of dledger.runtime.frames) and checks what the member does about it: memory
stays bounded (VmRSS of the member process), connections it must drop are dropped, and
it goes on answering clients and keeping its leadership. Nothing here asserts on timings:
waits poll a condition with a generous deadline.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from dledger.codes import PushType, RequestCode, ResponseCode
from dledger.core.messages import EntriesResponse
from dledger.runtime.transport import DEFAULT_MAX_FRAME_BYTES, HEADER_SIZE, KIND_REQUEST, KIND_RESPONSE
from integration.harness import Cluster, MakeCluster, holds_for, wait_until

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
_HEADER = struct.Struct(">IBQiI")  # L, kind, request id, code, M


# --- the wire, by hand -----------------------------------------------------------------------------


def fields(*values: Any) -> bytes:
    """An array-like message as the wire carries it (a msgpack array)."""
    return msgspec.msgpack.encode(list(values))


def frame(code: int, meta: bytes, data: bytes = b"", request_id: int = 1, kind: int = KIND_REQUEST) -> bytes:
    return _HEADER.pack(17 + len(meta) + len(data), kind, request_id, code, len(meta)) + meta + data


@dataclass(frozen=True)
class Frame:
    length: int  # L: everything after the length field
    kind: int
    request_id: int
    code: int
    meta: bytes
    data: bytes

    def decoded(self) -> Any:
        return msgspec.msgpack.decode(self.meta)


def address(c: Cluster, member: str) -> tuple[str, int]:
    host, _, port = c.peer_entry(member).split("-", 1)[1].rpartition(":")
    return host, int(port)


class Raw:
    """One TCP connection to a member, spoken to in raw frames."""

    def __init__(self, c: Cluster, member: str, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(address(c, member), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, code: int, meta: bytes, data: bytes = b"", request_id: int = 1) -> Frame:
        self.send(frame(code, meta, data, request_id))
        f = self.recv_frame()
        assert f.kind == KIND_RESPONSE and f.request_id == request_id, f
        return f

    def _exact(self, n: int) -> bytes:
        parts = []
        while n:
            chunk = self.sock.recv(min(n, 1 << 20))
            if not chunk:
                raise ConnectionError("closed by the member")
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def recv_frame(self) -> Frame:
        length, kind, request_id, code, mlen = _HEADER.unpack(self._exact(HEADER_SIZE))
        rest = self._exact(length - 17)
        return Frame(length, kind, request_id, code, rest[:mlen], rest[mlen:])

    def wait_closed(self, timeout: float = 30.0) -> bool:
        """True once the member closed the connection (EOF or reset) within `timeout`;
        anything it sends meanwhile is discarded."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready(self.sock, 0.2):
                try:
                    if not self.sock.recv(65536):
                        return True
                except (ConnectionResetError, BrokenPipeError):
                    return True
        return False


def ready(sock: socket.socket, timeout: float, events: int = select.POLLIN) -> bool:
    """Whether `sock` is readable (or writable, with POLLOUT) within `timeout` s; poll, not
    select: descriptors past 1024 are fine."""
    p = select.poll()
    p.register(sock, events)
    return bool(p.poll(timeout * 1000))


def is_closed(sock: socket.socket) -> bool:
    """Whether the member closed this connection (EOF or reset), without blocking."""
    if not ready(sock, 0):
        return False
    try:
        return sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
    except (BlockingIOError, InterruptedError, TimeoutError):
        return False
    except OSError:
        return True


def metadata_answered(c: Cluster, member: str) -> bool:
    """A fresh connection gets a METADATA answer from `member`."""
    with Raw(c, member) as r:
        f = r.request(RequestCode.METADATA, fields(c.group, "", member))
        return f.code == ResponseCode.SUCCESS


# --- the member process ------------------------------------------------------------------------------


def rss(c: Cluster, member: str) -> int:
    """Resident set size of `member`'s process, in bytes."""
    for line in Path(f"/proc/{c.procs[member].pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/<pid>/status")


def open_fds(c: Cluster, member: str) -> int:
    return len(os.listdir(f"/proc/{c.procs[member].pid}/fd"))


def peak_rss(c: Cluster, member: str, seconds: float) -> int:
    peak = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, rss(c, member))
        time.sleep(0.1)
    return peak


def alive(c: Cluster) -> None:
    for m, p in c.procs.items():
        assert p.poll() is None, f"{m} exited with code {p.returncode}"


def config(tmp_path: Path, **keys: int) -> list[str]:
    """`extra` arguments giving every member these configuration keys."""
    path = tmp_path / "limits.toml"
    path.write_text("".join(f"{k} = {v}\n" for k, v in keys.items()))
    return ["--config", str(path)]


def commits(c: Cluster, body: bytes = b"still serving") -> None:
    client = c.client()
    r = client.append(body)
    assert client.get(r.index).body == body


def views_of_others(c: Cluster, leader: str) -> dict[str, tuple[str | None, int] | None]:
    out: dict[str, tuple[str | None, int] | None] = {}
    for m in c.ids:
        if m != leader:
            v = c.meta(m)
            out[m] = None if v is None else (v.leader_id, v.term)
    return out


@contextlib.contextmanager
def sockets_closed_after(socks: list[socket.socket]) -> Iterator[list[socket.socket]]:
    try:
        yield socks
    finally:
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()


# --- the attacks ---------------------------------------------------------------------------------------


def test_announced_huge_frames_cost_nothing_until_sent(make_cluster: MakeCluster) -> None:
    """24 connections each announcing a 64 MiB frame (a 21-byte header, then nothing) made the
    member allocate every announced frame: 1.6 GB of RSS for 504 bytes sent."""
    c = make_cluster(3)
    leader = c.wait_leader()
    commits(c)
    base_rss, base_fds = rss(c, leader), open_fds(c, leader)
    length = DEFAULT_MAX_FRAME_BYTES - 64  # within max_frame_bytes: a frame the member must wait for
    header = _HEADER.pack(length, KIND_REQUEST, 7, RequestCode.APPEND, 0)
    with sockets_closed_after([]) as socks:
        for _ in range(24):
            s = socket.create_connection(address(c, leader), timeout=10)
            socks.append(s)
            s.sendall(header)
        # the member holds all 24 (each is mid-frame, well within frame_timeout) and still serves
        wait_until(lambda: open_fds(c, leader) >= base_fds + 24, 30, "the member accepted the 24 connections")
        assert wait_until(lambda: metadata_answered(c, leader), 30, "METADATA answered during the attack")
        grown = peak_rss(c, leader, 3.0) - base_rss
        assert grown < 200 * MiB, f"24 announced 64 MiB frames grew the member's RSS by {grown / MiB:.0f} MiB"
        assert not any(is_closed(s) for s in socks), "the member dropped a connection whose frame may still come"
        commits(c, b"during the attack")
    wait_until(lambda: open_fds(c, leader) <= base_fds + 2, 30,
               f"the member dropped the connections (fds back near {base_fds})")
    alive(c)


def test_a_slow_loris_is_closed_within_frame_timeout(make_cluster: MakeCluster, tmp_path: Path) -> None:
    """A client trickling a frame one byte a second held a connection (and its buffer) for ever."""
    c = make_cluster(3, extra=config(tmp_path, frame_timeout_ms=2000))
    leader = c.wait_leader()
    meta = fields(c.group, "", "", [b"x" * 200])
    trickle = frame(RequestCode.APPEND, meta)  # ~230 bytes: four minutes at a byte a second
    closed = False
    with Raw(c, leader) as r:
        r.sock.setblocking(False)
        deadline = time.monotonic() + 30
        sent = 0
        while time.monotonic() < deadline and sent < len(trickle):
            try:
                r.sock.send(trickle[sent : sent + 1])
            except (ConnectionResetError, BrokenPipeError):
                closed = True
                break
            sent += 1
            if r.wait_closed(1.0):
                closed = True
                break
        assert closed, f"the member still holds a connection that sent {sent} of a {len(trickle)}-byte frame"
        assert sent < len(trickle)
    assert metadata_answered(c, leader)
    commits(c)
    end = c.leader_meta().ledger_end_index
    assert all(e.body != b"x" * 200 for e in c.ctl.read(0, end + 1)), "the trickled append was stored"
    alive(c)


def test_connections_beyond_max_connections_are_closed(make_cluster: MakeCluster, tmp_path: Path) -> None:
    """Thousands of idle connections cost a member a 256 KiB buffer each, without limit."""
    want = 1500
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = want + 256
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    try:
        cap = 500
        c = make_cluster(3, extra=config(tmp_path, max_connections=cap))
        leader = c.wait_leader()
        commits(c)  # the test's clients connect before the attack
        base_rss, base_fds = rss(c, leader), open_fds(c, leader)
        with sockets_closed_after([]) as socks:
            for _ in range(want):
                socks.append(socket.create_connection(address(c, leader), timeout=10))

            def count_closed() -> int | None:
                n = sum(is_closed(s) for s in socks)
                return n if n >= want - cap else None

            closed = wait_until(count_closed, 60, f"the member closed at least {want - cap} of {want} connections")
            held = want - closed
            assert held <= cap, f"{held} connections held, max_connections is {cap}"
            fds = open_fds(c, leader)
            assert fds - base_fds <= cap, f"the member holds {fds - base_fds} more descriptors than before"
            grown = peak_rss(c, leader, 2.0) - base_rss
            assert grown < 150 * MiB, f"{held} idle connections grew the member's RSS by {grown / MiB:.0f} MiB"
            # clients connected before the flood are still served
            r = c.ctl.append(b"served while at the cap")
            assert c.ctl.get(r.index).body == b"served while at the cap"
        # once the attacker's connections are gone, new clients get in again
        wait_until(lambda: open_fds(c, leader) <= base_fds + 4, 30, "the member dropped the idle connections")
        fresh = c.client()
        r = wait_until(lambda: fresh.append(b"a new client after the attack"), 30, "a new client appends")
        assert fresh.get(r.index).body == b"a new client after the attack"
        alive(c)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextlib.contextmanager
def flooding(c: Cluster, member: str, blob: bytes, conns: int
             ) -> Iterator[tuple[list[threading.Thread], list[int], list[BaseException]]]:
    """`conns` connections to `member`, each writing `blob` from a thread, never reading; the
    threads, bytes sent per connection and errors. Stopped and closed on exit."""
    sent = [0] * conns
    errors: list[BaseException] = []
    stop = threading.Event()
    with sockets_closed_after([]) as socks:
        for _ in range(conns):
            s = socket.create_connection(address(c, member), timeout=10)
            s.setblocking(False)
            socks.append(s)
        threads = [threading.Thread(target=_flood, args=(s, blob, sent, k, stop, errors), daemon=True)
                   for k, s in enumerate(socks)]
        for t in threads:
            t.start()
        try:
            yield threads, sent, errors
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)


def _flood(sock: socket.socket, blob: bytes, sent: list[int], slot: int, stop: threading.Event,
           errors: list[BaseException]) -> None:
    """Write `blob` as fast as the socket takes it, never reading; give up once it takes
    nothing for 10 s (the member holding back a client that does not read is fair)."""
    try:
        view = memoryview(blob)
        done = 0
        last = time.monotonic()
        while done < len(blob) and not stop.is_set():
            if not ready(sock, 0.2, select.POLLOUT):
                if time.monotonic() - last > 10:
                    break
                continue
            try:
                n = sock.send(view[done : done + 256 * 1024])
            except BlockingIOError:
                continue
            done += n
            sent[slot] = done
            last = time.monotonic()
    except OSError as e:  # the member closed the connection: recorded, judged by the test
        errors.append(e)


def test_a_pipelined_flood_does_not_starve_heartbeats(make_cluster: MakeCluster) -> None:
    """100k METADATA frames written to the leader without reading an answer: it handled them
    all in one event-loop turn, sent no heartbeat for seconds and was deposed."""
    c = make_cluster(3)
    leader = c.wait_leader()
    commits(c)
    term = c.leader_meta().term
    want = {m: (leader, term) for m in c.ids if m != leader}
    assert views_of_others(c, leader) == want
    one = frame(RequestCode.METADATA, fields(c.group, "", ""))
    conns, per_conn = 4, 30_000
    views: list[dict[str, tuple[str | None, int] | None]] = []
    with flooding(c, leader, one * per_conn, conns) as (threads, sent, errors):
        while any(t.is_alive() for t in threads):
            views.append(views_of_others(c, leader))
            time.sleep(0.2)
        for t in threads:
            t.join(timeout=30)
        frames_sent = sum(n // len(one) for n in sent)
        assert not errors, f"the member dropped a flooding connection: {errors!r}"
        assert frames_sent >= 100_000, f"only {frames_sent} frames could be written"
        # the unread answers pile up; the leader must keep leading meanwhile
        holds_for(lambda: views_of_others(c, leader) == want, 5.0, "the followers keep the leader")
    bad = [v for v in views if v != want]
    assert not bad, f"followers saw another leader or term during the flood (want {want}): {bad[:3]}"
    assert c.wait_leader() == leader
    assert c.leader_meta().term == term
    commits(c)
    alive(c)


def _elections(samples: list[dict[str, tuple[str | None, int] | None]]) -> int:
    """How often the term the followers report rose across `samples` (one not answering skipped)."""
    terms = [max((x[1] for x in v.values() if x is not None), default=None) for v in samples]
    seen = [t for t in terms if t is not None]
    return sum(1 for a, b in itertools.pairwise(seen) if b > a)


def _watch(c: Cluster, leader: str, peak: int) -> tuple[list[dict[str, tuple[str | None, int] | None]], int]:
    """8 s of the followers' views (and the leader's peak RSS)."""
    views: list[dict[str, tuple[str | None, int] | None]] = []
    for _ in range(40):
        views.append(views_of_others(c, leader))
        peak = max(peak, rss(c, leader))
        time.sleep(0.2)
    return views, peak


def _flood_keeps_leader(c: Cluster, leader: str, blob: bytes, conns: int = 1) -> int:
    """Write `blob` to the leader on `conns` connections, never reading: the followers see no
    more leader or term changes during 8 s of the flood than during 8 s without it just before
    (on a quiet machine: none; a loaded one may depose a leader with no attack at all, and a
    flood that stalls the leader's loop past the election timeout deposes it every time). The
    leader's peak RSS."""
    before, peak = _watch(c, leader, rss(c, leader))
    with flooding(c, leader, blob, conns):
        views, peak = _watch(c, leader, peak)  # unread answers piling up
    allowed, elections = _elections(before), _elections(before[-1:] + views)
    assert elections <= allowed, (f"followers saw {elections} elections during the flood, {allowed} in as long "
                                  f"without it: {views[:3]}")
    c.wait_leader()
    return peak


def test_costly_requests_pipelined_do_not_depose_the_leader(make_cluster: MakeCluster) -> None:
    """64 READs of an 8 MiB log (2.7 KB on the wire) were all handled in one loop turn: the
    leader stalled past the election timeout, at 1 GB of answers; and 64 APPENDs of 10,000
    bodies in one send deposed it too. Work is now budgeted per loop turn and answers that
    do not drain stop the reading."""
    c = make_cluster(3)
    leader = c.wait_leader()
    client = c.client(timeout=30)
    for _ in range(8):
        client.append_batch([b"x" * 262144] * 4)
    base = rss(c, leader)
    read = frame(RequestCode.READ, fields(c.group, "", "", 0, 100_000, (1 << 31) - 1))
    peak = _flood_keeps_leader(c, leader, read * 64)
    assert peak - base < 300 * MiB, f"unread READ answers grew the leader by {(peak - base) / MiB:.0f} MiB"
    bodies = frame(RequestCode.APPEND, fields(c.group, "", "", [b"b"] * 10_000))
    _flood_keeps_leader(c, leader, bodies * 64)
    commits(c)
    alive(c)


def test_an_append_of_a_million_empty_bodies_is_refused_at_decode(make_cluster: MakeCluster) -> None:
    """One APPEND of 1,000,000 empty bodies stalled the leader for 1.5 s, enough to be deposed."""
    c = make_cluster(3)
    leader = c.wait_leader()
    commits(c)
    before = c.leader_meta()
    meta = fields(c.group, "", "", [b""] * 1_000_000)
    with Raw(c, leader, timeout=30) as r:
        f = r.request(RequestCode.APPEND, meta)
    assert f.code == ResponseCode.UNEXPECTED_ARGUMENT, f"answered {f.code}: {f.decoded()!r}"
    answer = f.decoded()
    message = answer[-1] if isinstance(answer, list) else answer.get("error", "") if isinstance(answer, dict) else ""
    assert isinstance(message, str) and message, f"a 411 without a message: {answer!r}"
    holds_for(lambda: c.agreed_leader() == leader, 2.0, "the leader keeps its leadership")
    after = c.leader_meta()
    assert (after.self_id, after.term) == (leader, before.term)
    assert after.ledger_end_index == before.ledger_end_index, "the refused append stored entries"
    commits(c)
    alive(c)


def test_read_answers_are_bounded_by_max_read_bytes(make_cluster: MakeCluster, tmp_path: Path) -> None:
    """A READ asking for 2**40 entries and bytes built its whole answer in memory."""
    cap = 4 * MiB
    c = make_cluster(3, extra=config(tmp_path, max_read_bytes=cap))
    leader = c.wait_leader()
    body_size, total = 16 * 1024, 1280  # 20 MiB
    bodies = [i.to_bytes(4, "big") * (body_size // 4) for i in range(total)]
    start = -1
    for k in range(0, total, 64):
        results = c.ctl.append_batch(bodies[k : k + 64])
        if start < 0:
            start = results[0].index
    c.wait_caught_up()
    with Raw(c, leader, timeout=30) as r:
        huge = r.request(RequestCode.READ, fields(c.group, "", "", start, 2**40, 2**40, True, False), request_id=1)
        assert huge.code == ResponseCode.UNEXPECTED_ARGUMENT, f"READ of 2**40 answered {huge.code}"
        big = r.request(RequestCode.READ, fields(c.group, "", "", start, 2**31 - 1, 2**31 - 1, True, False),
                        request_id=2)
    assert big.code == ResponseCode.SUCCESS, f"answered {big.code}: {big.decoded()!r}"
    slack = body_size + 64 * 1024  # one entry past the limit, plus framing
    assert big.length <= cap + slack, f"a READ answer of {big.length} bytes, max_read_bytes is {cap}"
    resp = msgspec.msgpack.decode(big.meta, type=EntriesResponse)
    got = resp.entries
    assert got, "an empty answer"
    assert len(got) < total, "the whole log in one answer"
    assert [e.index for e in got] == list(range(start, start + len(got)))
    assert [e.body for e in got] == bodies[: len(got)]
    assert resp.next_index == start + len(got)
    alive(c)


def test_a_valid_frame_followed_by_garbage_is_answered_then_closed(make_cluster: MakeCluster) -> None:
    """Garbage after a request made the member drop the connection before answering it."""
    c = make_cluster(3)
    leader = c.wait_leader()
    commits(c)
    garbage: Sequence[bytes] = (
        b"\xff" * 64,  # announces a frame beyond max_frame_bytes
        struct.pack(">I", 5) + b"\x00" * 40,  # shorter than a header
        _HEADER.pack(40, 9, 1, 0, 0) + b"\x00" * 23,  # an unknown kind
        frame(RequestCode.METADATA, b"", b"", 3, KIND_RESPONSE),  # a response sent to a server
        _HEADER.pack(20, KIND_REQUEST, 1, RequestCode.METADATA, 50) + b"\x00" * 3,  # meta longer than the frame
    )
    for junk in garbage:
        with Raw(c, leader) as r:
            r.send(frame(RequestCode.METADATA, fields(c.group, "", leader), request_id=41) + junk)
            f = r.recv_frame()
            assert (f.kind, f.request_id, f.code) == (KIND_RESPONSE, 41, ResponseCode.SUCCESS), (junk, f)
            assert r.wait_closed(30), f"connection still open after {junk!r}"
    # an APPEND is answered later (after the quorum): it must still get its answer
    body = b"appended before the garbage"
    with Raw(c, leader) as r:
        r.send(frame(RequestCode.APPEND, fields(c.group, "", "", [body]), request_id=42) + b"\xff" * 64)
        f = r.recv_frame()
        assert (f.request_id, f.code) == (42, ResponseCode.SUCCESS), f.decoded()
        index = f.decoded()[3]
        assert r.wait_closed(30)
    assert c.ctl.get(index).body == body
    alive(c)


def test_malformed_payloads_are_411_without_a_traceback(make_cluster: MakeCluster,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    """A PUSH whose data is shorter than a record header, and invalid UTF-8 in a string
    field, were answered INTERNAL_ERROR with a traceback in the member's log."""
    c = make_cluster(3)  # started here: the members' stderr is the captured one
    leader = c.wait_leader()
    commits(c)
    follower = next(m for m in c.ids if m != leader)
    term = c.leader_meta().term
    end = c.wait_caught_up()
    bad_group = b"\xa2\xff\xfe"  # a msgpack str that is not UTF-8
    bad_remote = b"\xa3n\xc3\x28"

    def push(first_index: int) -> bytes:
        return fields(c.group, leader, follower, term, int(PushType.APPEND), -1, -1, first_index, 1, -1, -1)

    def raw_array(*encoded: bytes) -> bytes:
        return bytes([0x90 | len(encoded)]) + b"".join(encoded)

    enc = msgspec.msgpack.encode
    attacks: list[tuple[str, str, int, bytes, bytes]] = [
        ("short push past the end", follower, RequestCode.PUSH, push(end + 1), b"\x00" * 10),
        ("short push at the end", follower, RequestCode.PUSH, push(end), b"\x01" * 30),
        ("APPEND, group not UTF-8", leader, RequestCode.APPEND, raw_array(bad_group, enc(""), enc(""), enc([b"x"])),
         b""),
        ("READ, remote not UTF-8", leader, RequestCode.READ, raw_array(enc(c.group), enc(""), bad_remote, enc(0)), b""),
        ("GET, group not UTF-8", leader, RequestCode.GET, raw_array(bad_group, enc(""), enc(""), enc(0)), b""),
    ]
    base: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        conns = {m: stack.enter_context(Raw(c, m)) for m in (leader, follower)}
        for what, member, code, meta, data in attacks:
            f = conns[member].request(code, meta, data)
            assert f.code != ResponseCode.INTERNAL_ERROR, f"{what}: INTERNAL_ERROR {f.decoded()!r}"
            want = {ResponseCode.UNEXPECTED_ARGUMENT}
            if code == RequestCode.PUSH:  # data the follower cannot store is also a log mismatch
                want.add(ResponseCode.INCONSISTENT_STATE)
            assert f.code in want, f"{what}: answered {f.code}"
        # repeated, memory must not grow
        base = {m: rss(c, m) for m in conns}
        for k in range(2000):
            what, member, code, meta, data = attacks[k % len(attacks)]
            f = conns[member].request(code, meta, data, request_id=k + 10)
            assert f.code != ResponseCode.INTERNAL_ERROR, f"{what}, attempt {k}: INTERNAL_ERROR"
    for m, before in base.items():
        grown = rss(c, m) - before
        assert grown < 50 * MiB, f"{m}'s RSS grew by {grown / MiB:.0f} MiB over 2,000 malformed requests"
    commits(c)
    alive(c)
    err = capfd.readouterr().err
    # every member warns "no TLS" at start: without it their stderr was not captured (pytest -s),
    # and the memory check above is what is left
    if "no TLS" in err:
        assert "Traceback" not in err, err[max(0, err.find("Traceback") - 2000) :][:6000]
        assert "handler failed" not in err, err
