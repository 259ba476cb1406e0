"""A group of real member processes on 127.0.0.1 whose links all go through proxies.

Member nK listens on its own port; its peers string names every other member at the
port of the proxy for the link nK->other, so each directed link can be cut, black-holed
or slowed on its own (see `proxy`). Clients talk to the members' own ports.

The harness owns every process it starts: `close()` (also run at interpreter exit)
resumes paused members and kills whatever is still running, so a failed or
interrupted run leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dledger.chaos.proxy import Mode, ProxyHub, quiet_exception_handler
from dledger.codes import DLedgerError
from dledger.ports import HOST, free_ports
from dledger.runtime.client import AsyncDLedgerClient, Metadata

log = logging.getLogger(__name__)

T = TypeVar("T")


# --- an event loop in a thread, for control-plane requests --------------------------------------------------


class LoopThread:
    """An asyncio loop on a daemon thread; `run` executes a coroutine there and waits."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(quiet_exception_handler)
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


# --- members -------------------------------------------------------------------------------------------------


@dataclass
class Member:
    id: str
    port: int
    store_dir: Path
    log_path: Path
    peers: str = ""  # this member's own peers string (others through the link proxies)
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    incarnation: int = 0
    expect_exit: bool = False  # we killed or stopped it: its exit is no crash
    crash_reported: bool = False

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


Listener = Callable[[str, str, dict[str, Any]], None]  # (member, event, details)


class Harness:
    """Start, kill, pause, resume and restart members; shape links through the proxies."""

    def __init__(self, nodes: int, base_dir: Path, *, flush: str = "async", group: str = "chaos",
                 verbose: bool = True, on_event: Listener | None = None, extra_args: Sequence[str] = ()) -> None:
        """`extra_args`: more `dledger server` options for every member (e.g. `--config F`)."""
        if nodes < 1:
            raise ValueError("need at least one member")
        self.group = group
        self.flush = flush
        self.extra_args = list(extra_args)
        self.dir = Path(base_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.verbose = verbose
        self.on_event = on_event
        self.ids = [f"n{k}" for k in range(nodes)]
        ports = free_ports(nodes)
        self.members = {
            m: Member(m, p, self.dir / "stores" / m, self.dir / "logs" / f"{m}.log")
            for m, p in zip(self.ids, ports, strict=True)
        }
        self.client_peers = ";".join(f"{m.id}-{m.address}" for m in self.members.values())
        self.proxies = ProxyHub()
        self._all_procs: list[subprocess.Popen[bytes]] = []
        self._closed = False
        atexit.register(self.close)
        try:
            self._start_proxies()
        except BaseException:
            self.close()
            raise
        self.ctl = LoopThread("chaos-control")
        self._ctl_client = AsyncDLedgerClient(self.client_peers, group, timeout=2.0, request_timeout=1.0)

    def _start_proxies(self) -> None:
        avoid = {m.port for m in self.members.values()}
        for src in self.ids:
            parts = []
            for dst in self.ids:
                if dst == src:
                    parts.append(f"{dst}-{self.members[dst].address}")
                    continue
                for _attempt in range(20):
                    port = free_ports(1, avoid)[0]
                    avoid.add(port)
                    try:
                        self.proxies.add(src, dst, port, self.members[dst].port)
                        break
                    except OSError:
                        continue
                else:
                    raise OSError(f"no free port for the proxy of {src}->{dst}")
                parts.append(f"{dst}-{HOST}:{port}")
            self.members[src].peers = ";".join(parts)

    def _event(self, member: str, event: str, **details: Any) -> None:
        log.info("%s: %s %s", member, event, details or "")
        if self.on_event is not None:
            self.on_event(member, event, details)

    # --- processes ------------------------------------------------------------------------------------

    def start(self, member: str) -> None:
        m = self.members[member]
        if m.running:
            raise RuntimeError(f"{member} is already running")
        m.store_dir.mkdir(parents=True, exist_ok=True)
        m.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "dledger", *(["-v"] if self.verbose else []), "server",
               "--group", self.group, "--id", member, "--peers", m.peers,
               "--store-dir", str(m.store_dir), "--flush", self.flush, "--enable-fault-injection", *self.extra_args]
        with open(m.log_path, "ab") as out:
            out.write(f"\n=== {time.strftime('%H:%M:%S')} start {member} (incarnation {m.incarnation + 1})\n"
                      .encode())
            out.flush()
            m.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._all_procs.append(m.proc)
        m.paused = False
        m.expect_exit = False
        m.crash_reported = False
        m.incarnation += 1
        self._event(member, "started", pid=m.proc.pid, incarnation=m.incarnation)

    def start_all(self) -> None:
        for m in self.ids:
            self.start(m)

    def kill(self, member: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send `sig` (SIGKILL by default) and wait until the process is gone."""
        m = self.members[member]
        p = m.proc
        if p is None or p.poll() is not None:
            return
        m.expect_exit = True
        self._event(member, "killing", signal=sig.name)
        if m.paused:  # resumed first, so a stopped process never lingers half-dead
            p.send_signal(signal.SIGCONT)
        p.send_signal(sig)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if m.paused:
            m.paused = False
        self._event(member, "killed", returncode=p.returncode)

    def pause(self, member: str) -> None:
        m = self.members[member]
        if m.running and not m.paused and m.proc is not None:
            m.proc.send_signal(signal.SIGSTOP)
            m.paused = True
            self._event(member, "paused")

    def resume(self, member: str) -> None:
        m = self.members[member]
        if m.paused and m.proc is not None:
            if m.proc.poll() is None:
                m.proc.send_signal(signal.SIGCONT)
            m.paused = False
            self._event(member, "resumed")

    def stop_all(self, timeout: float = 20.0) -> dict[str, int | None]:
        """Clean stop (SIGTERM: each member flushes and writes its checkpoint); SIGKILL
        whoever does not exit in time. Returns each member's exit code."""
        for m in self.members.values():
            self.resume(m.id)
        self.check_crashes()
        for m in self.members.values():
            m.expect_exit = True
            if m.running and m.proc is not None:
                m.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes: dict[str, int | None] = {}
        for m in self.members.values():
            if m.proc is None:
                codes[m.id] = None
                continue
            forced = False
            try:
                m.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0f s; killing it", m.id, timeout)
                forced = True
                m.proc.kill()
                m.proc.wait()
            codes[m.id] = m.proc.returncode
            self._event(m.id, "stopped", returncode=m.proc.returncode, forced=forced,
                        log_tail=self.log_tail(m.id) if m.proc.returncode else "")
        return codes

    def check_crashes(self) -> dict[str, int]:
        """Members whose process ended though nobody stopped it: each is reported once
        (event "crashed", with the end of its log), and returned with its exit code."""
        out = {}
        for m in self.members.values():
            if m.proc is None or m.expect_exit or m.crash_reported:
                continue
            code = m.proc.poll()
            if code is not None:
                m.crash_reported = True
                out[m.id] = code
                self._event(m.id, "crashed", returncode=code, log_tail=self.log_tail(m.id))
        return out

    def log_tail(self, member: str, lines: int = 20) -> str:
        try:
            text = self.members[member].log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        """Leave no process behind: resume paused members, then kill everything started."""
        if self._closed:
            return
        self._closed = True
        for p in self._all_procs:
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    p.send_signal(signal.SIGCONT)
                with contextlib.suppress(OSError):
                    p.kill()
        for p in self._all_procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        if hasattr(self, "ctl"):
            with contextlib.suppress(Exception):
                self.ctl.run(self._ctl_client.close(), timeout=5)
            self.ctl.close()
        self.proxies.close()
        atexit.unregister(self.close)

    # --- links ----------------------------------------------------------------------------------------------

    def connect_only(self, allowed: Iterable[tuple[str, str]], mode: Mode = "refuse") -> None:
        """Make exactly the given (unordered) member pairs reachable; every other link
        gets `mode`. Links are cut in both directions."""
        ok = {frozenset(p) for p in allowed}
        changes: dict[tuple[str, str], tuple[Mode, float]] = {}
        for (src, dst) in self.proxies.links:
            changes[(src, dst)] = ("pass", 0.0) if frozenset((src, dst)) in ok else (mode, 0.0)
        self.proxies.set_many(changes)

    def cut_outgoing(self, member: str, mode: Mode = "refuse") -> None:
        """One-way fault: `member` reaches nobody (its requests, and the answers on those
        connections, are lost) while the others still reach it."""
        self.proxies.set_many({(s, d): (mode if s == member else "pass", 0.0) for (s, d) in self.proxies.links})

    def slow(self, member: str, delay_s: float) -> None:
        """Delay every chunk on each link to and from `member`."""
        self.proxies.set_many({(s, d): ("pass", delay_s) for (s, d) in self.proxies.links if member in (s, d)})

    def heal_links(self) -> None:
        self.proxies.heal_all()

    def cut_off_but_handover(self, member: str) -> str | None:
        """`member` drops all member traffic at its own door, except the hand-over of a
        leadership transfer it sends (a transfer cut off mid-way); None, or the error."""
        others = [m for m in self.ids if m != member]
        try:
            self.ctl.run(self._ctl_client.inject_faults(member, others, spare_handover=True), timeout=10)
        except (DLedgerError, TimeoutError) as e:
            return str(e)
        return None

    def heal_member_faults(self, member: str) -> None:
        """Undo `cut_off_but_handover` (a member restarted since has none anyway)."""
        if self.members[member].running and not self.members[member].paused:
            with contextlib.suppress(DLedgerError, TimeoutError):
                self.ctl.run(self._ctl_client.inject_faults(member, []), timeout=10)

    # --- views ------------------------------------------------------------------------------------------------

    def metadata(self, member: str) -> Metadata | None:
        """`member`'s own view, or None when it does not answer within a second."""
        try:
            return self.ctl.run(self._ctl_client.metadata(member), timeout=10)
        except (DLedgerError, TimeoutError):
            return None

    def views(self, members: Sequence[str] | None = None) -> dict[str, Metadata | None]:
        """Every (running, not paused) member's view, asked concurrently."""
        targets = [m for m in (members or self.ids) if self.members[m].running and not self.members[m].paused]

        async def ask() -> list[Metadata | BaseException]:
            return await asyncio.gather(*(self._ctl_client.metadata(m) for m in targets), return_exceptions=True)

        try:
            answers = self.ctl.run(ask(), timeout=15)
        except TimeoutError:
            answers = [TimeoutError() for _ in targets]
        out: dict[str, Metadata | None] = {m: None for m in (members or self.ids)}
        for m, a in zip(targets, answers, strict=True):
            out[m] = a if isinstance(a, Metadata) else None
        return out

    def leader(self) -> str | None:
        """The member that says it leads, in the highest term any leader reports."""
        leaders = [v for v in self.views().values() if v is not None and v.role == "leader"]
        if not leaders:
            return None
        return max(leaders, key=lambda v: v.term).self_id

    def wait_leader(self, timeout: float = 30.0) -> str | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lead = self.leader()
            if lead is not None:
                return lead
            time.sleep(0.2)
        return None

    def transfer(self, leader: str, target: str, timeout: float = 10.0) -> str | None:
        """Ask `leader` to hand leadership to `target`; None on success, else the error."""

        async def go() -> None:
            async with AsyncDLedgerClient(self.client_peers, self.group, timeout=timeout,
                                          request_timeout=timeout) as c:
                c.leader_id = leader
                await c.transfer_leadership(target)

        try:
            self.ctl.run(go(), timeout=timeout + 10)
        except (DLedgerError, TimeoutError) as e:
            return str(e)
        return None

    def caught_up(self) -> tuple[bool, dict[str, tuple[int, int] | None]]:
        """True when one leader is agreed on and every member holds and has committed the
        same end. Also returns each member's (ledger_end_index, committed_index)."""
        views = self.views()
        seen = {m: (v.ledger_end_index, v.committed_index) if v else None for m, v in views.items()}
        if any(v is None for v in views.values()):
            return False, seen
        leaders = {v.leader_id for v in views.values() if v is not None}
        ends = {s for s in seen.values() if s is not None}
        ok = len(leaders) == 1 and None not in leaders and len(ends) == 1
        ok = ok and all(e == c for e, c in ends)
        return ok, seen

    def trusted_point(self, member: str) -> dict[str, Any] | None:
        """The `trusted` record of a stopped member's checkpoint (None when absent)."""
        try:
            data = json.loads((self.members[member].store_dir / "checkpoint").read_bytes())
        except (OSError, ValueError):
            return None
        t = data.get("trusted") if isinstance(data, dict) else None
        return t if isinstance(t, dict) else None

    def pids(self) -> dict[str, int | None]:
        return {m.id: (m.proc.pid if m.running and m.proc is not None else None) for m in self.members.values()}


def describe_env() -> dict[str, Any]:
    return {"python": sys.version.split()[0], "pid": os.getpid(), "cpus": os.cpu_count()}
