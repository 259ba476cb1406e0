"""Read consistency on real processes (issue 12): reads sent to a leader paused past an
election are never stale in `linearizable` or `lease` mode, which confirm leadership (or hold
a lease) first. (`leader` mode is shielded here too: the resumed member runs its timers,
whose check-quorum deposes it, before it reads its sockets. Its stale read is shown
deterministically by the simulator, tests/sim/test_reads.py, in a leadership transfer.)
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from dledger.codes import DLedgerError, RequestCode, ResponseCode
from dledger.core.messages import EntriesResponse, ReadRequest, decode_response, encode
from dledger.runtime.client import DLedgerClient
from dledger.runtime.transport import Message, TransportClient
from integration.harness import Cluster, MakeCluster, wait_until

pytestmark = pytest.mark.integration


async def _read(client: TransportClient, address: str, group: str, member: str, consistency: str) -> object:
    """READ from 0 at one member, as sent to whoever leads (not by name: no follower read): its
    entries' bodies, or its error code."""
    req = ReadRequest(group, "", "", 0, 100_000, 4 << 20, True, False, consistency)
    try:
        raw = await client.request(address, Message(RequestCode.READ, encode(req)), 30.0)
    except DLedgerError as e:
        return e.code
    resp = decode_response(RequestCode.READ, raw.meta)
    assert isinstance(resp, EntriesResponse)
    return [e.body for e in resp.entries] if resp.code == ResponseCode.SUCCESS else ResponseCode(resp.code)


def _steady(c: Cluster, n: int) -> tuple[DLedgerClient, list[bytes], str, str]:
    """n entries appended and everywhere: (client, their bodies, the leader, its address)."""
    client = c.client(timeout=30)
    before = [f"before-{k}".encode() for k in range(n)]
    for b in before:
        client.append(b)
    c.wait_caught_up()
    old = c.wait_leader()
    return client, before, old, c.peer_entry(old).split("-", 1)[1]


def test_reads_sent_to_a_paused_deposed_leader_are_never_stale(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    client, before, old, address = _steady(c, 5)
    others = [m for m in c.ids if m != old]
    loop = asyncio.new_event_loop()
    transport = TransportClient()
    # connected before the pause: the reads wait on an open socket, handled as soon as it resumes
    assert loop.run_until_complete(_read(transport, address, c.group, old, "leader")) == before
    c.procs[old].send_signal(signal.SIGSTOP)
    for m in others:  # nothing of the new term reaches the old leader before the reads do
        c.ctl.inject_faults(m, [old])
    try:
        new = c.wait_leader(others, timeout=60, what="a new leader while the old one is paused")
        assert new != old
        after = c.client(c.peers_of(others), timeout=30)
        after.append(b"after")  # acknowledged before any of the reads below is sent

        async def scenario() -> dict[str, object]:
            modes = ["linearizable", "lease"]
            tasks = [asyncio.create_task(_read(transport, address, c.group, old, m)) for m in modes]
            await asyncio.sleep(1.0)  # sent: they wait in the paused leader's socket
            c.procs[old].send_signal(signal.SIGCONT)
            return dict(zip(modes, await asyncio.gather(*tasks), strict=True))

        got = loop.run_until_complete(scenario())
    finally:
        c.procs[old].send_signal(signal.SIGCONT)
        loop.run_until_complete(transport.close())
        loop.close()
        for m in others:
            c.ctl.inject_faults(m, [])
    for mode in ("linearizable", "lease"):
        assert got[mode] in (ResponseCode.NOT_LEADER, ResponseCode.LEADER_TRANSFERRING), (mode, got[mode])
    # through the client (which follows the redirect) both see the acknowledged append
    for mode in ("linearizable", "lease"):
        assert [e.body for e in client.read(0, 100, consistency=mode)] == [*before, b"after"]
    wait_until(lambda: c.agreed_leader() is not None, 60, "the old leader follows again")


def test_linearizable_and_lease_reads_serve_on_a_healthy_group(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    client = c.client(timeout=30)
    for k in range(20):
        r = client.append(f"e{k}".encode())
        for mode in ("linearizable", "lease", "leader"):
            assert client.get(r.index, consistency=mode).body == f"e{k}".encode()
    assert client.metadata(consistency="linearizable").role == "leader"
    with pytest.raises(DLedgerError) as e:
        client.read(0, consistency="bogus")
    assert e.value.code == ResponseCode.UNEXPECTED_ARGUMENT


def test_a_follower_serves_linearizable_reads_with_the_leaders_read_index(make_cluster: MakeCluster) -> None:
    c = make_cluster(3, extra=["--state-machine", "kv"])
    from dledger.kv import KVClient

    kv = KVClient("", client=c.client(timeout=30))
    leader = c.wait_leader()
    follower = next(m for m in c.ids if m != leader)
    log = c.client(timeout=30)
    for k in range(30):  # each read follows the put it must see, at a follower
        assert kv.put("key", f"v{k}").ok
        item = kv.get("key", consistency="linearizable", member=follower)
        assert item is not None and item.value == f"v{k}".encode()
        r = log.append(f"e{k}".encode())
        assert log.get(r.index, member=follower, consistency="lease").body == f"e{k}".encode()
    # a member by name without a consistency reads its own copy (may trail; never an error)
    assert kv.get("key", member=follower) is not None


def test_a_transfer_cut_off_midway_leaves_a_stale_leader_only_leader_mode_reads_from(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    """The stale read `leader` mode has, on real processes: the leader sends its hand-over to
    the target and is cut off right after (it drops everything else, both ways); the target
    wins at once (a transfer's votes ignore leases) and commits an acknowledged append, while
    the old leader, hearing nothing, believes it leads until its check-quorum (a long lease
    here). A `leader` read there misses the append; `linearizable` and `lease` never answer."""
    toml = tmp_path / "long-lease.toml"
    # 4 s (250 ms x 16) before the old leader's check-quorum deposes it
    toml.write_text("heart_beat_time_interval_ms = 250\nmax_heart_beat_leak = 16\n")
    c = make_cluster(3, extra=["--config", str(toml)])
    client, before, old, address = _steady(c, 3)
    target, other = [m for m in c.ids if m != old]
    c.ctl.inject_faults(old, [target, other], spare_handover=True)
    transfer = threading.Thread(target=lambda: _ignore_errors(lambda: c.client(timeout=10)
                                                              .transfer_leadership(target)), daemon=True)
    transfer.start()
    loop = asyncio.new_event_loop()
    transport = TransportClient()
    try:
        wait_until(lambda: (v := c.meta(target)) is not None and v.role == "leader", 30, f"{target} takes over")
        client2 = c.client(c.peers_of([target, other]), timeout=30)
        client2.append(b"after")  # acknowledged by the new leader
        got = {mode: loop.run_until_complete(_read(transport, address, c.group, old, mode))
               for mode in ("leader", "linearizable", "lease")}
        still = c.meta(old)
    finally:
        loop.run_until_complete(transport.close())
        loop.close()
        c.ctl.inject_faults(old, [])
    assert still is not None and still.role == "leader", "the old leader stepped down too early to show it"
    assert got["leader"] == before, got["leader"]  # stale: the acknowledged append is missing
    for mode in ("linearizable", "lease"):
        assert isinstance(got[mode], ResponseCode), (mode, got[mode])  # refused, never served stale
    transfer.join(30)
    wait_until(lambda: c.agreed_leader() is not None, 60, "the old leader follows again")
    assert [e.body for e in client.read(0, 100)] == [*before, b"after"]


def _ignore_errors(fn: Callable[[], object]) -> None:
    with contextlib.suppress(DLedgerError):  # the cut-off leader's transfer times out
        fn()
