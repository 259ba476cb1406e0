"""TCP proxies, one per directed link between two members, that the nemesis controls.

Why proxies: a member connects to the others at the addresses its own peers string
gives, so pointing member A at "the proxy for A->B" puts every byte A sends to B (and
B's answers on that connection) under our control, without asking a member to
misbehave. A link is in one of three modes:

- ``pass``: bytes are forwarded, optionally each chunk held back by ``delay_s``
  (order is kept, as TCP would);
- ``refuse``: live connections are reset and the listening port stops listening
  (it stays bound, so nobody else can take it): a connect fails at once, as when
  the host is down and answers with RST;
- ``blackhole``: connections are accepted (and live ones kept) but every byte is
  dropped: requests time out, as when packets vanish in the network. Going back to
  ``pass`` resets the connections that lost bytes, so framing never resumes mid-frame.

All proxies run on one event loop in a thread of their own (`ProxyHub`); the
control methods are thread-safe and return once the change is in effect.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

log = logging.getLogger(__name__)

Mode = Literal["pass", "refuse", "blackhole"]
MODES: tuple[Mode, ...] = ("pass", "refuse", "blackhole")
T = TypeVar("T")

_CHUNK = 256 * 1024


@dataclass(eq=False)  # identity hashing: pipes live in a set
class _Pipe:
    """One proxied connection: the accepted side and, when passing, the upstream side."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    dropping: bool = False  # blackholed at some point: bytes were lost, must be reset on heal

    def abort(self) -> None:
        for w in (self.client, self.upstream):
            if w is not None:
                with contextlib.suppress(Exception):
                    w.transport.abort()
        for t in self.tasks:
            if t is not asyncio.current_task():
                t.cancel()


class LinkProxy:
    """Listen on 127.0.0.1:`port` and forward to `target_port`, as the link `name` (src->dst)."""

    def __init__(self, name: str, host: str, port: int, target_host: str, target_port: int) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.target = (target_host, target_port)
        self.mode: Mode = "pass"
        self.delay_s = 0.0
        self.accepted = 0
        self.forwarded_bytes = 0
        self._pipes: set[_Pipe] = set()
        self._server: asyncio.Server | None = None
        self._placeholder: socket.socket | None = None

    # --- lifecycle (on the hub's loop) --------------------------------------------------------

    async def start(self) -> None:
        await self._listen(self._bound_socket())

    def _bound_socket(self) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((self.host, self.port))
        except OSError:
            s.close()
            raise
        return s

    async def _listen(self, sock: socket.socket) -> None:
        sock.listen(128)
        sock.setblocking(False)
        self._server = await asyncio.start_server(self._accept, sock=sock, limit=_CHUNK)

    async def _stop_listening(self) -> None:
        """Close the listener but keep the port bound (no listen: connects get RST)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()
        if self._placeholder is None:
            self._placeholder = self._bound_socket()

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for p in list(self._pipes):
            p.abort()
        self._pipes.clear()
        if self._placeholder is not None:
            self._placeholder.close()
            self._placeholder = None

    # --- control (on the hub's loop) ------------------------------------------------------------

    async def set(self, mode: Mode, delay_s: float) -> None:
        old = self.mode
        self.mode, self.delay_s = mode, max(0.0, delay_s)
        if mode == old:
            return
        log.debug("link %s: %s -> %s", self.name, old, mode)
        if mode == "refuse":
            for p in list(self._pipes):
                p.abort()
            await self._stop_listening()
        elif mode == "blackhole":
            for p in self._pipes:
                p.dropping = True
        if mode != "refuse" and self._server is None:
            sock, self._placeholder = self._placeholder, None
            await self._listen(sock if sock is not None else self._bound_socket())
        if mode == "pass":
            for p in [p for p in self._pipes if p.dropping]:
                p.abort()

    # --- forwarding -----------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pipe = _Pipe(writer)
        self.accepted += 1
        if self.mode == "refuse":  # raced with the listener closing
            pipe.abort()
            return
        self._pipes.add(pipe)
        try:
            if self.mode == "blackhole":
                pipe.dropping = True
                await self._drain_forever(reader)
                return
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*self.target, limit=_CHUNK), 2.0)
            except (OSError, TimeoutError):
                return  # the target is down: the member sees its connection reset
            pipe.upstream = up_writer
            if pipe.dropping or self.mode != "pass":
                return
            loop = asyncio.get_running_loop()
            pipe.tasks = [loop.create_task(self._pump(pipe, reader, up_writer)),
                          loop.create_task(self._pump(pipe, up_reader, writer))]
            await asyncio.gather(*pipe.tasks, return_exceptions=True)
        finally:
            self._pipes.discard(pipe)
            pipe.abort()

    @staticmethod
    async def _drain_forever(reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(Exception):
            while await reader.read(_CHUNK):
                pass

    async def _pump(self, pipe: _Pipe, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction. Chunks wait in a queue until their due time (the delay at
        the time they were read), so a delay never reorders bytes."""
        queue: collections.deque[tuple[float, bytes]] = collections.deque()
        ready = asyncio.Event()
        done = False

        async def sender() -> None:
            try:
                while True:
                    while not queue:
                        if done:
                            return
                        ready.clear()
                        await ready.wait()
                    due, data = queue.popleft()
                    wait = due - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    if pipe.dropping:
                        continue
                    writer.write(data)
                    self.forwarded_bytes += len(data)
                    await writer.drain()
            except (OSError, RuntimeError):  # the other side went away: the reader notices too
                pipe.abort()

        send_task = asyncio.get_running_loop().create_task(sender())
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                if pipe.dropping:
                    continue
                queue.append((time.monotonic() + self.delay_s, data))
                ready.set()
            done = True
            ready.set()
            await send_task
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            send_task.cancel()
            pipe.abort()  # one side closed or failed: close both, as a broken link would


def quiet_exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Log what asyncio could not deliver in one line, without a traceback: formatting a
    traceback (which parses source with `ast` on 3.11) in a background thread can race
    with `ast` use in the main thread (CPython gh-106905, fixed after 3.11.7)."""
    log.warning("event loop: %s: %r", context.get("message"), context.get("exception"))


class ProxyHub:
    """All link proxies of a run, on one event loop in a daemon thread."""

    def __init__(self) -> None:
        self.links: dict[tuple[str, str], LinkProxy] = {}
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="chaos-proxies", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
            loop = asyncio.new_event_loop()
        self._loop = loop
        loop.set_exception_handler(quiet_exception_handler)
        asyncio.set_event_loop(loop)
        self._ready.set()
        loop.run_forever()
        loop.close()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        assert self._loop is not None
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result(timeout)

    def add(self, src: str, dst: str, port: int, target_port: int, host: str = "127.0.0.1") -> LinkProxy:
        """Start the proxy for link src->dst on `port` (raises OSError if it is taken)."""
        link = LinkProxy(f"{src}->{dst}", host, port, host, target_port)
        self._call(link.start())
        self.links[(src, dst)] = link
        return link

    def set_link(self, src: str, dst: str, mode: Mode, delay_s: float = 0.0) -> None:
        self._call(self.links[(src, dst)].set(mode, delay_s))

    def set_many(self, changes: dict[tuple[str, str], tuple[Mode, float]]) -> None:
        """Apply several link changes in one step on the loop (a partition starts at once)."""

        async def apply() -> None:
            for (src, dst), (mode, delay) in changes.items():
                await self.links[(src, dst)].set(mode, delay)

        self._call(apply())

    def heal_all(self) -> None:
        self.set_many({k: ("pass", 0.0) for k in self.links})

    def state(self) -> dict[str, tuple[Mode, float]]:
        return {link.name: (link.mode, link.delay_s) for link in self.links.values()}

    def close(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        async def close_all() -> None:
            for link in self.links.values():
                await link.close()

        with contextlib.suppress(Exception):
            self._call(close_all())
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=5)
