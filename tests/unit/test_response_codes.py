"""Every response message carries a `code` (docs/format.md, "Every response message carries a
code"), added so that peers and clients of the layout without it still decode the messages."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import msgspec
import pytest

import dledger
from dledger.broker import messages as bm
from dledger.codes import RequestCode, ResponseCode
from dledger.core.messages import VoteResponse, decode_response

SUCCESS = int(ResponseCode.SUCCESS)


def _message_modules() -> list[ModuleType]:
    """Every `messages` module of the package (each defines one side's wire messages)."""
    found = [importlib.import_module(m.name) for m in pkgutil.walk_packages(dledger.__path__, "dledger.")
             if m.name.rsplit(".", 1)[-1] == "messages"]
    assert {m.__name__ for m in found} >= {"dledger.core.messages", "dledger.broker.messages",
                                           "dledger.controller.messages"}
    return found


def _answers() -> list[type[msgspec.Struct]]:
    out = []
    for module in _message_modules():
        for name, obj in vars(module).items():
            if (isinstance(obj, type) and issubclass(obj, msgspec.Struct) and obj.__module__ == module.__name__
                    and (name == "Response" or name.endswith("Response"))):
                out.append(obj)
    return [*out, bm.RuntimeInfo]  # GET_BROKER_RUNTIME_INFO's answer (not named *Response)


def test_every_response_struct_has_a_code() -> None:
    answers = _answers()
    assert len(answers) >= 15
    missing = [f"{a.__module__}.{a.__qualname__}" for a in answers if "code" not in a.__struct_fields__]
    assert missing == []


class _OldVote(msgspec.Struct, array_like=True):
    """VoteResponse as it was before `code`."""

    term: int
    result: int
    pre_vote: bool = False


class _OldSend(msgspec.Struct, omit_defaults=True):
    epoch: int
    first_index: int
    offsets: list[int]


class _OldPull(msgspec.Struct, omit_defaults=True):
    entries: list[bm.PulledEntry] = []
    next_index: int = 0
    begin_index: int = 0
    confirm_offset: int = -1


@pytest.mark.parametrize("old", [_OldVote(7, 1), _OldVote(7, 3, True)])
def test_old_vote_layout_still_decodes(old: _OldVote) -> None:
    new = decode_response(RequestCode.VOTE, msgspec.msgpack.encode(old))
    assert isinstance(new, VoteResponse)
    assert (new.term, new.result, new.pre_vote, new.code) == (old.term, old.result, old.pre_vote, SUCCESS)


def test_new_vote_decodes_on_an_old_peer() -> None:
    raw = msgspec.msgpack.encode(VoteResponse(7, 1, True))
    assert msgspec.msgpack.decode(raw, type=_OldVote) == _OldVote(7, 1, True)
    assert msgspec.msgpack.decode(raw, type=VoteResponse).code == SUCCESS


def test_broker_answers_keep_their_bytes() -> None:
    """SUCCESS is the default and left off the wire: the bytes are the old layout's."""
    send = bm.SendResponse(3, 10, [0, 64])
    assert bm.encode(send) == msgspec.msgpack.encode(_OldSend(3, 10, [0, 64]))
    assert bm.send_response.decode(msgspec.msgpack.encode(_OldSend(3, 10, [0, 64]))) == send
    entries = [bm.PulledEntry(0, 0, 1, b"x")]
    pull = bm.PullResponse(entries, 1, 0, 41)
    assert bm.encode(pull) == msgspec.msgpack.encode(_OldPull(entries, 1, 0, 41))
    assert bm.pull_response.decode(msgspec.msgpack.encode(_OldPull(entries, 1, 0, 41))).code == SUCCESS
    assert bm.fault_response.decode(b"\x80").code == SUCCESS  # (an empty map)


def test_a_code_that_is_not_success_is_carried() -> None:
    raw = bm.encode(bm.SendResponse(3, 10, [0], code=int(ResponseCode.INTERNAL_ERROR)))
    assert bm.send_response.decode(raw).code == ResponseCode.INTERNAL_ERROR
