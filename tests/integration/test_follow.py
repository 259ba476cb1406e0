"""Following the log (issue 12): `subscribe` gets every committed entry once, in order, as
it commits, across a leader kill; `dledger read --follow` prints them like `tail -f`.
Waits poll a condition up to a generous deadline; nothing is timed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from dledger.runtime.client import Entry
from integration.harness import MakeCluster, read_all, wait_until

pytestmark = pytest.mark.integration


def test_subscribe_sees_every_entry_once_in_order_across_a_leader_kill(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    writer = c.client(timeout=30)
    start = writer.append(b"start").index
    got: list[Entry] = []
    stop = threading.Event()
    sub_client = c.client(timeout=30)

    def follow() -> None:
        for e in sub_client.subscribe(start, wait=2.0):
            got.append(e)
            if stop.is_set():
                return

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    acked: list[bytes] = []
    for k in range(150):
        if k == 60:
            c.kill(c.wait_leader())  # SIGKILL: the subscriber's long poll loses its leader
        body = f"entry-{k}".encode()
        for _ in range(20):  # an unknown outcome is retried: a body may be stored twice, never lost
            try:
                writer.append(body)
                break
            except Exception:
                continue
        acked.append(body)
    end = c.wait_caught_up(members=[m for m in c.ids if m not in c.down], timeout=60)
    wait_until(lambda: bool(got) and got[-1].index >= end, 60, "the subscriber reaches the end of the log")
    stop.set()
    writer.append(b"wake the subscriber")  # so its loop sees `stop`
    t.join(timeout=30)
    indexes = [e.index for e in got]
    assert indexes == sorted(set(indexes)), "an entry came twice or out of order"
    log = read_all(writer)  # {index: (term, body)}, committed NORMAL entries
    want = [(i, log[i][1]) for i in sorted(log) if start <= i <= end]
    assert [(e.index, e.body) for e in got if e.index <= end] == want  # no gap: every committed entry
    assert set(acked) <= {b for _, b in want}


def test_read_follow_prints_entries_as_they_commit(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    client = c.client(timeout=30)
    first = client.append(b"one").index
    p = subprocess.Popen([sys.executable, "-m", "dledger", "read", "--peers", c.peers, "--group", c.group,
                          "--from", str(first), "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    try:
        assert p.stdout is not None
        assert json.loads(p.stdout.readline())["body"] == "one"
        client.append(b"two")  # appended after the follower is waiting
        assert json.loads(p.stdout.readline())["body"] == "two"
    finally:
        p.send_signal(signal.SIGINT)
        try:
            code = p.wait(timeout=30)
        except subprocess.TimeoutExpired:  # say where it hung: faulthandler prints every thread
            p.send_signal(signal.SIGABRT)
            stacks = p.communicate(timeout=30)[1]
            pytest.fail(f"`dledger read --follow` ignored SIGINT for 30 s; its threads:\n{stacks}")
        assert code == 130, p.communicate(timeout=30)[1]
