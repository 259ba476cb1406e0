"""Forged and malformed member messages against a real group over TCP (issue 11).

Each attack is sent as raw frames through the transport, as an attacker with a socket would;
the member must answer with a code (411 for what fails validation, 401/402 for a sender that
is not another member), persist nothing, and go on serving.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgspec
import pytest

from dledger.codes import PushType, RequestCode, ResponseCode
from dledger.core.messages import VoteResponse, VoteResult
from dledger.entry import HEADER_SIZE
from dledger.runtime.transport import Message, TransportClient
from integration.harness import Cluster, MakeCluster, wait_until

pytestmark = pytest.mark.integration


def send_raw(c: Cluster, member: str, code: int, meta: bytes, data: bytes = b"") -> int:
    """Send one frame to `member`; the response code (a VOTE answered with SUCCESS: its
    result, ACCEPT or a refusal; a vote refused for an error carries the error's code)."""
    address = c.peer_entry(member).split("-", 1)[1]

    async def go() -> int:
        t = TransportClient()
        try:
            resp = await t.request(address, Message(code, meta, data), 10.0)
        finally:
            await t.close()
        if code == RequestCode.VOTE and resp.code == ResponseCode.SUCCESS:
            return int(msgspec.msgpack.decode(resp.meta, type=VoteResponse).result)
        return resp.code

    return asyncio.run(go())


def fields(*values: Any) -> bytes:
    """An array-like message as the wire carries it (a msgpack array)."""
    return msgspec.msgpack.encode(list(values))


def _commits(c: Cluster) -> None:
    client = c.client()
    r = client.append(b"still serving")
    assert client.get(r.index).body == b"still serving"


def test_a_forged_term_past_the_bounds_is_refused_and_persists_nothing(make_cluster: MakeCluster) -> None:
    """A HEART_BEAT with term 2**63 - 1 was persisted in currterm and spread: no member could
    write a record header again, even after restarts."""
    c = make_cluster(3)
    leader = c.wait_leader()
    target = next(m for m in c.ids if m != leader)
    term = c.leader_meta().term
    code = send_raw(c, target, RequestCode.HEART_BEAT, fields(c.group, leader, target, 2**63 - 1, -1))
    assert code == ResponseCode.UNEXPECTED_ARGUMENT
    meta = c.meta(target)
    assert meta is not None and meta.term == term
    c.kill(target)
    c.restart(target)
    meta = wait_until(lambda: c.meta(target), what="restarted member answers")
    assert meta.term < 1 << 62
    _commits(c)


@pytest.mark.parametrize("sender", ["", "self", "zz"])
def test_member_messages_must_name_another_member(make_cluster: MakeCluster, sender: str) -> None:
    """A HEART_BEAT with an empty sender was accepted (the follower's leader became "")."""
    c = make_cluster(3)
    leader = c.wait_leader()
    target = next(m for m in c.ids if m != leader)
    term = c.leader_meta().term
    forged = target if sender == "self" else sender
    code = send_raw(c, target, RequestCode.HEART_BEAT, fields(c.group, forged, target, term, -1))
    want = ResponseCode.UNKNOWN_MEMBER if sender == "zz" else ResponseCode.UNEXPECTED_MEMBER
    assert code == want
    assert send_raw(c, target, RequestCode.PUSH, fields(c.group, forged, target, term + 5)) == want
    vote = fields(c.group, forged, target, term + 5, 1 << 40, term + 5, False, True)
    assert send_raw(c, target, RequestCode.VOTE, vote) != VoteResult.ACCEPT
    meta = c.meta(target)
    assert meta is not None and meta.leader_id == leader and meta.term == term
    _commits(c)


def test_invalid_utf8_is_a_411_not_an_internal_error(make_cluster: MakeCluster) -> None:
    c = make_cluster(3)
    c.wait_leader()
    # a msgpack array whose first string (the group) is not UTF-8
    meta = b"\x93\xa2\xff\xfe\xa2n0\xa2n1"
    assert send_raw(c, "n0", RequestCode.METADATA, meta) == ResponseCode.UNEXPECTED_ARGUMENT
    assert send_raw(c, "n0", RequestCode.HEART_BEAT, meta) == ResponseCode.UNEXPECTED_ARGUMENT
    _commits(c)


def test_a_short_or_zero_size_push_neither_crashes_nor_hangs_a_follower(make_cluster: MakeCluster) -> None:
    """PUSH data shorter than a header gave INTERNAL_ERROR with a traceback; a record header
    claiming size 0 at an index the follower holds made it loop for ever."""
    c = make_cluster(3)
    leader = c.wait_leader()
    _commits(c)
    target = next(m for m in c.ids if m != leader)
    term = c.leader_meta().term

    def push(data: bytes) -> int:
        req = fields(c.group, leader, target, term, int(PushType.APPEND), -1, -1, 0, 1, -1, -1)
        return send_raw(c, target, RequestCode.PUSH, req, data)

    assert push(b"\x00" * 10) == ResponseCode.INCONSISTENT_STATE
    zero_size = struct.pack(">iiqqqiIII", 1, 0, 0, term, 0, 0, 0, 0, 0)
    assert len(zero_size) == HEADER_SIZE
    assert push(zero_size + zero_size) == ResponseCode.INCONSISTENT_STATE
    meta = c.meta(target)
    assert meta is not None and meta.leader_id == leader
    _commits(c)
