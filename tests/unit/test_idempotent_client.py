"""The idempotent client's reactions to the leader's producer refusals (runtime.client,
runtime.producer), against a stand-in member that answers what each test says."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from dledger.codes import DLedgerError, ResponseCode
from dledger.core.messages import AppendRequest, AppendResponse
from dledger.runtime.client import AppendSpan, AsyncDLedgerClient

Answer = AppendResponse | DLedgerError


def run(answers: list[Answer], bodies: list[bytes], next_seq: int = 0, new_sessions: bool = True,
        span: bool = False) -> tuple[list[AppendRequest], AsyncDLedgerClient, object]:
    """One append_batch (or append_span) as producer "svc" (at `next_seq`); the requests sent,
    the client, and what the call returned or raised."""
    c = AsyncDLedgerClient("n0-127.0.0.1:1", "g", timeout=10.0, idempotent=True, producer_id="svc")
    assert c.producer is not None
    c.producer.next_seq, c.producer.new_sessions = next_seq, new_sessions
    sent: list[AppendRequest] = []

    async def member(member: str, code: int, req: msgspec.Struct, request_timeout: float | None = None) -> Answer:
        if not isinstance(req, AppendRequest):  # the client following the configuration (MEMBERS)
            raise DLedgerError(ResponseCode.UNSUPPORTED, "a stand-in answers appends only")
        sent.append(req)
        answer = answers.pop(0)
        if isinstance(answer, DLedgerError):
            raise answer
        return answer

    c._call_member = member  # type: ignore[method-assign,assignment]

    async def call() -> object:
        try:
            return await (c.append_span(bodies) if span else c.append_batch(bodies))
        except DLedgerError as e:
            return e

    return sent, c, asyncio.run(call())


def ok(index: int, n: int) -> AppendResponse:
    return AppendResponse(200, "n0", 1, index, list(range(n)))


def test_an_evicted_producer_starts_a_new_session_and_sends_its_bodies_again() -> None:
    sent, c, result = run([DLedgerError(ResponseCode.UNKNOWN_PRODUCER, "unknown"), ok(9, 2)], [b"a", b"b"],
                          next_seq=5)
    assert [r.index for r in result] == [9, 10]  # type: ignore[attr-defined]
    assert [(r.producer, r.epoch, r.sequence, r.bodies) for r in sent] == \
        [("svc", 0, 5, [b"a", b"b"]), ("svc", 1, 0, [b"a", b"b"])]
    assert c.producer is not None and (c.producer.epoch, c.producer.next_seq) == (1, 2)


def test_a_producer_whose_epochs_are_the_callers_gets_unknown_producer() -> None:
    sent, c, result = run([DLedgerError(ResponseCode.UNKNOWN_PRODUCER, "unknown")], [b"a"], next_seq=5,
                          new_sessions=False)
    assert isinstance(result, DLedgerError) and result.code == ResponseCode.UNKNOWN_PRODUCER
    assert len(sent) == 1 and c.producer is not None and c.producer.epoch == 0


def test_a_rate_limited_creation_is_sent_again() -> None:
    sent, _, result = run([DLedgerError(ResponseCode.PRODUCER_RATE_LIMITED, "slow down"), ok(3, 1)], [b"a"])
    assert [r.index for r in result] == [3]  # type: ignore[attr-defined]
    assert [(r.epoch, r.sequence) for r in sent] == [(0, 0), (0, 0)]


@pytest.mark.parametrize("code", [ResponseCode.SEQUENCE_REUSED, ResponseCode.PRODUCER_NOT_OWNED,
                                  ResponseCode.DUPLICATE_UNVERIFIABLE, ResponseCode.PRODUCER_FENCED])
def test_a_reused_or_foreign_id_is_raised_at_once(code: ResponseCode) -> None:
    sent, _, result = run([DLedgerError(code, "no")], [b"a"])
    assert isinstance(result, DLedgerError) and result.code == code and len(sent) == 1
    # the way on names this client's parameters (another principal's id: only another id helps)
    named = "producer_epoch above" in result.message and "another producer_id" in result.message
    assert named == (code != ResponseCode.PRODUCER_NOT_OWNED), result.message


def test_a_span_names_the_first_and_last_index_as_the_results_would() -> None:
    sent, c, result = run([ok(9, 3)], [b"a", bytearray(b"b"), memoryview(b"c")], next_seq=5,  # type: ignore[list-item]
                          span=True)
    assert result == AppendSpan(9, 11, 3, 0)
    assert [type(b) for b in sent[0].bodies] == [bytes] * 3 and sent[0].bodies == [b"a", b"b", b"c"]
    assert c.producer is not None and c.producer.next_seq == 8
    # some in the log already: each its own index, as append_batch's results
    dup = AppendResponse(200, "n0", 2, 4, [0, 1, 2], indexes=[4, 7, 8], terms=[1, 2, 2], duplicates=1)
    _, c, result = run([dup], [b"a", b"b", b"c"], span=True)
    assert result == AppendSpan(4, 8, 3, 1)
    _, _, results = run([dup], [b"a", b"b", b"c"])
    assert [r.index for r in results] == [4, 7, 8]  # type: ignore[attr-defined]
    assert c.producer is not None and c.producer.duplicates == 1


def test_a_callers_list_changed_after_an_append_changes_nothing_sent() -> None:
    """The request owns its list of bodies (the producer compares a resend with them)."""
    bodies = [b"a", b"b"]
    sent, c, result = run([DLedgerError(ResponseCode.SEQUENCE_REUSED, "no")], bodies)
    assert isinstance(result, DLedgerError) and len(sent) == 1
    bodies[0] = b"changed"
    assert sent[0].bodies == [b"a", b"b"]
    assert c.producer is not None and c.producer._unsettled == [b"a", b"b"]
