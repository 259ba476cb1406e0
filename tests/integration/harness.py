"""Helpers for integration tests: real member processes on 127.0.0.1 over TCP.

Nothing here asserts on elapsed time. Waits poll a condition until a generous
deadline, which only bounds how long a failure takes to show; `holds_for`
samples a condition over a window for the "this must not happen" checks
(a minority electing a leader, an isolated member raising its term).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from dledger.codes import DLedgerError, ResponseCode
from dledger.local_cluster import local_cluster
from dledger.ports import free_ports
from dledger.runtime.client import AppendResult, DLedgerClient, Metadata
from dledger.store import FileLedgerStore

T = TypeVar("T")

POLL_S = 0.05  # a wait's condition is checked this often (a wait ends this late, on average half of it)
SAMPLE_S = 0.15  # holds_for's samples (it runs for its whole duration whatever the interval)


# --- waiting ---------------------------------------------------------------------------------------


def wait_until(cond: Callable[[], T | None], timeout: float = 30.0, what: str = "condition",
               interval: float = POLL_S) -> T:
    """Poll `cond` until it returns a truthy value (returned); a DLedgerError counts as
    not yet. Fails the test with the last value seen once `timeout` passes."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = cond()
            if value:
                return value
            last = value
        except DLedgerError as e:
            last = e
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not reached within {timeout:.0f} s (last seen: {last!r})")
        time.sleep(interval)


def holds_for(cond: Callable[[], bool], duration: float, what: str, interval: float = SAMPLE_S) -> int:
    """Sample `cond` for `duration` seconds; fail as soon as it is false. Returns the
    number of samples taken (at least one)."""
    end = time.monotonic() + duration
    samples = 0
    while True:
        assert cond(), f"{what}: violated after {samples} good samples"
        samples += 1
        if time.monotonic() >= end:
            return samples
        time.sleep(interval)


# --- ports -----------------------------------------------------------------------------------------


# --- stores opened offline -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredEntry:
    index: int
    term: int
    magic: int
    body: bytes
    chain_crc: int


@dataclass(frozen=True)
class StoreDump:
    path: Path
    begin_index: int
    end_index: int
    committed_index: int
    entries: list[StoredEntry]

    @property
    def last_chain_crc(self) -> int:
        return self.entries[-1].chain_crc if self.entries else 0

    def body_at(self, index: int) -> bytes:
        e = self.entries[index - self.begin_index]
        assert e.index == index
        return e.body


def dump_store(path: Path) -> StoreDump:
    """Every entry of a stopped member's store (default file sizes, as the CLI uses)."""
    store = FileLedgerStore(path)
    try:
        entries = []
        for i in range(store.begin_index, store.end_index + 1):
            e = store.get(i)
            entries.append(StoredEntry(e.index, e.term, e.magic, bytes(e.body), e.chain_crc))
        return StoreDump(path, store.begin_index, store.end_index, store.committed_index, entries)
    finally:
        store.close()


# --- a group of member processes ---------------------------------------------------------------------------


class Cluster:
    """One group run as OS processes through `dledger.local_cluster`."""

    def __init__(self, n: int, data_dir: Path, *, group: str = "it", flush: str = "async",
                 extra: Sequence[str] = (), metrics_base_port: int = 0, fault_injection: bool = True,
                 tls_dir: Path | None = None, auth_token: str | None = None, command: str = "server") -> None:
        self.ids = [f"n{k}" for k in range(n)]
        self.group = group
        self.data_dir = data_dir
        self.flush = flush
        ports = free_ports(n)
        self.peers = ";".join(f"{m}-127.0.0.1:{p}" for m, p in zip(self.ids, ports, strict=True))
        self.metrics_base_port = metrics_base_port  # member k serves /metrics on this + k (0: none)
        # members obey FAULT (partition, isolate, heal) only when started with the flag
        args = [*extra, *(["--enable-fault-injection"] if fault_injection else [])]
        self._lc = local_cluster(self.peers, group, data_dir, flush, "file", metrics_base_port, extra=args,
                                 tls_dir=tls_dir, auth_token=auth_token, command=command, ready_poll_s=POLL_S)
        self._all_procs: list[subprocess.Popen[bytes]] = []
        self._clients: list[DLedgerClient] = []
        self.down: set[str] = set()
        self.ctl = self.client(role="admin")  # faults, transfers: an operator's requests

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def procs(self) -> dict[str, subprocess.Popen[bytes]]:
        return self._lc.procs

    def start(self) -> None:
        """Start every member and wait until all know a leader (asked every POLL_S: nearly
        every test starts a group)."""
        try:
            self._lc.__enter__()
        finally:
            self._all_procs.extend(self._lc.procs.values())

    def start_members(self, members: Iterable[str]) -> None:
        """Start only `members`, without waiting (the others later, by `restart`): a group
        whose first majority must be chosen, e.g. the one member holding a log and one empty."""
        for m in members:
            self._all_procs.append(self._lc.start_member(m))
            self.down.discard(m)
        self.down.update(m for m in self.ids if m not in self._lc.procs)

    def stop(self) -> None:
        """Stop every member cleanly (SIGTERM), then close the test's clients."""
        self._lc.__exit__(None, None, None)
        for m, p in self.procs.items():
            assert p.poll() is not None, f"{m} still running"
            self.down.add(m)

    def cleanup(self) -> None:
        """Teardown: whatever happened, leave no process behind."""
        for c in self._clients:
            with contextlib.suppress(Exception):
                c.close()
        self._clients.clear()
        with contextlib.suppress(Exception):
            self._lc.__exit__(None, None, None)
        for p in self._all_procs:
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)

    def client(self, peers: str | None = None, timeout: float = 5.0, role: str = "client") -> DLedgerClient:
        c = DLedgerClient(peers or self.peers, self.group, timeout=timeout, **self._lc.client_options(role))
        self._clients.append(c)
        return c

    def peer_entry(self, member: str) -> str:
        """`member`'s part of the peers string."""
        return next(p for p in self.peers.split(";") if p.startswith(f"{member}-"))

    def peers_of(self, members: Iterable[str]) -> str:
        return ";".join(self.peer_entry(m) for m in members)

    def store_dir(self, member: str) -> Path:
        return self.data_dir / self.group / member

    def kill(self, member: str, sig: signal.Signals = signal.SIGKILL) -> None:
        p = self.procs[member]
        p.send_signal(sig)
        p.wait(timeout=20)
        self.down.add(member)

    def restart(self, member: str) -> None:
        assert self.procs[member].poll() is not None, f"{member} is still running"
        p = self._lc.start_member(member)
        self._all_procs.append(p)
        self.down.discard(member)

        def answers() -> bool:
            assert p.poll() is None, f"{member} exited with code {p.returncode}"
            return self.meta(member) is not None

        wait_until(answers, 30, f"{member} answers after restart")

    @property
    def alive(self) -> list[str]:
        return [m for m in self.ids if m not in self.down]

    # --- views ------------------------------------------------------------------------------------

    def meta(self, member: str) -> Metadata | None:
        """`member`'s own view, or None if it does not answer."""
        try:
            return self.ctl.metadata(member)
        except DLedgerError:
            return None

    def views(self, members: Iterable[str] | None = None) -> dict[str, Metadata | None]:
        return {m: self.meta(m) for m in (self.alive if members is None else members)}

    def agreed_leader(self, members: Iterable[str] | None = None) -> str | None:
        """The leader every one of `members` (default: those running) names, in the term the
        leader itself reports, when exactly one of them says it leads; else None."""
        views = self.views(members)
        if any(v is None for v in views.values()):
            return None
        leaders = [m for m, v in views.items() if v is not None and v.role == "leader"]
        if len(leaders) != 1:
            return None
        lead = views[leaders[0]]
        assert lead is not None
        if all(v is not None and v.leader_id == lead.self_id and v.term == lead.term for v in views.values()):
            return lead.self_id
        return None

    def wait_leader(self, members: Iterable[str] | None = None, timeout: float = 30.0,
                    what: str = "a leader all members agree on") -> str:
        group = list(self.alive if members is None else members)
        return wait_until(lambda: self.agreed_leader(group), timeout, f"{what} among {group}")

    def leader_meta(self, members: Iterable[str] | None = None) -> Metadata:
        lead = self.wait_leader(members)
        m = self.meta(lead)
        assert m is not None
        return m

    def caught_up(self, members: Iterable[str] | None = None) -> int | None:
        """The common ledger end index once every member holds and has committed the same
        end under one agreed leader; else None."""
        group = list(self.alive if members is None else members)
        if self.agreed_leader(group) is None:
            return None
        views = self.views(group)
        ends = {v.ledger_end_index for v in views.values() if v is not None}
        commits = {v.committed_index for v in views.values() if v is not None}
        if len(ends) == 1 and commits == ends and None not in views.values():
            return ends.pop()
        return None

    def wait_caught_up(self, members: Iterable[str] | None = None, timeout: float = 60.0) -> int:
        group = list(self.alive if members is None else members)

        def done() -> tuple[int] | None:  # a tuple: an end index of -1 or 0 is falsy
            end = self.caught_up(group)
            return None if end is None else (end,)

        return wait_until(done, timeout, f"members {group} hold and commit the same end")[0]

    # --- faults -------------------------------------------------------------------------------------

    def partition(self, side_a: Sequence[str], side_b: Sequence[str]) -> None:
        """Cut every member of side_a off from every member of side_b (both directions)."""
        for a in side_a:
            self.ctl.inject_faults(a, list(side_b))
        for b in side_b:
            self.ctl.inject_faults(b, list(side_a))

    def isolate(self, member: str) -> None:
        self.partition([member], [m for m in self.ids if m != member])

    def heal(self) -> None:
        for m in self.alive:
            self.ctl.inject_faults(m, [])


# --- a client appending continuously ------------------------------------------------------------------------


@dataclass
class Ack:
    index: int
    term: int
    body: bytes


@dataclass
class Appender:
    """A thread appending unique bodies one by one until stopped, recording every
    acknowledged result and every failure code. Each body is sent once: the client
    never retries a request whose outcome is unknown, so no body may appear twice."""

    peers: str
    group: str
    prefix: str
    timeout: float = 5.0
    acked: list[Ack] = field(default_factory=list)
    failed: list[tuple[ResponseCode, bytes]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    sent: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"appender-{self.prefix}", daemon=True)

    def start(self) -> Appender:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout + 30)
        assert not self._thread.is_alive(), "appender did not stop"
        assert not self.errors, f"appender failed unexpectedly: {self.errors!r}"

    def _run(self) -> None:
        try:
            with DLedgerClient(self.peers, self.group, timeout=self.timeout) as c:
                while not self._stop.is_set():
                    body = f"{self.prefix}-{self.sent}".encode()
                    self.sent += 1
                    try:
                        r: AppendResult = c.append(body)
                    except DLedgerError as e:
                        self.failed.append((e.code, body))
                        time.sleep(0.05)
                        continue
                    self.acked.append(Ack(r.index, r.term, body))
        except BaseException as e:  # reported by stop()
            self.errors.append(e)


def check_acked_in_log(acked: Sequence[Ack], log: dict[int, tuple[int, bytes]], where: str) -> None:
    """Every acknowledged append is at its acknowledged index, with its term and body."""
    missing = [a for a in acked if log.get(a.index) != (a.term, a.body)]
    assert not missing, (
        f"{where}: {len(missing)} of {len(acked)} acknowledged entries lost or changed, e.g. "
        f"{[(a.index, a.term, a.body, log.get(a.index)) for a in missing[:5]]}"
    )


def read_all(client: DLedgerClient, member: str | None = None) -> dict[int, tuple[int, bytes]]:
    """Every committed NORMAL entry, through the client: index -> (term, body); from the
    leader, or from `member`'s own committed copy."""
    out: dict[int, tuple[int, bytes]] = {}
    nxt = 0
    while True:
        batch = client.read(nxt, 1000, member=member)
        if not batch:
            return out
        for e in batch:
            assert e.index not in out, f"read returned index {e.index} twice"
            out[e.index] = (e.term, e.body)
        nxt = batch[-1].index + 1


class MakeCluster(Protocol):
    def __call__(self, n: int = 3, *, flush: str = "async", extra: Sequence[str] = (),
                 metrics: bool = False, fault_injection: bool = True, tls_dir: Path | None = None,
                 auth_token: str | None = None) -> Cluster: ...
