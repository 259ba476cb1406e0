"""dledger_requests_total against an embedded member over TCP: its `kind` label, and the
requests refused before any group (wrong group, unknown code, junk, no token) counted under
a bounded set of label values however many made-up names arrive."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from dledger import DLedgerConfig, DLedgerError, DLedgerServer, ResponseCode
from dledger.codes import RequestCode
from dledger.core.messages import GetRequest, MetadataRequest, VoteRequest, encode
from dledger.ports import free_ports
from dledger.runtime.transport import Message, TransportClient

TOKEN = "s3cret"
UNKNOWN_CODES = (52990, 52991)  # no request has these codes
MADE_UP_GROUPS = 40


def requests_total(server: DLedgerServer) -> dict[tuple[str, str, str, str, str], float]:
    """Every dledger_requests_total series: (group, member, kind, request, code) -> value."""
    assert server.metrics is not None
    out = {}
    for fam in server.metrics.registry.collect():
        for s in fam.samples:
            if s.name == "dledger_requests_total":
                lab = s.labels
                out[(lab["group"], lab["member"], lab["kind"], lab["request"], lab["code"])] = s.value
    return out


def test_refusals_are_counted_with_bounded_labels(tmp_path: Path) -> None:
    """One process serving group a as n0 and group b as m0 (a token required): requests for
    made-up groups all land on group "?" (member "m0,n0"), unknown codes on request "unknown"."""
    port, metrics_port = free_ports(2)
    configs = [DLedgerConfig(group=g, self_id=me, peers=f"{me}-127.0.0.1:{port}", store_dir=str(tmp_path / g),
                             data_file_size=1 << 20, auth_token=TOKEN, metrics_port=metrics_port)
               for g, me in (("a", "n0"), ("b", "m0"))]
    address = f"127.0.0.1:{port}"

    async def main() -> dict[tuple[str, str, str, str, str], float]:
        server = DLedgerServer(configs)
        await server.start()
        client = TransportClient(auth_token=TOKEN.encode())
        stranger = TransportClient()  # no token
        liar = TransportClient(auth_token=b"wrong")

        async def ask(t: TransportClient, code: int, meta: bytes) -> int:
            return (await t.request(address, Message(code, meta), 10.0)).code

        try:
            assert await ask(client, RequestCode.METADATA, encode(MetadataRequest(group="a"))) == ResponseCode.SUCCESS
            # a vote from a stranger to group b: the node answers it (whatever it says), as member traffic
            await ask(client, RequestCode.VOTE, encode(VoteRequest(group="b", leader_id="x9", remote_id="m0")))
            for k in range(MADE_UP_GROUPS):
                got = await ask(client, RequestCode.GET, encode(GetRequest(group=f"made-up-{k}", index=0)))
                assert got == ResponseCode.UNKNOWN_GROUP
            for code in UNKNOWN_CODES:
                assert await ask(client, code, b"") == ResponseCode.UNSUPPORTED
            assert await ask(client, RequestCode.GET, b"\xc1") == ResponseCode.UNEXPECTED_ARGUMENT  # no msgpack
            bad_index = msgspec.msgpack.encode(["a", "", "", "not an index"])  # names group a, then junk
            assert await ask(client, RequestCode.GET, bad_index) == ResponseCode.UNEXPECTED_ARGUMENT
            assert await ask(stranger, RequestCode.METADATA, encode(MetadataRequest(group="a"))) \
                == ResponseCode.UNAUTHENTICATED
            assert await ask(stranger, RequestCode.VOTE, encode(VoteRequest(group="a"))) \
                == ResponseCode.UNAUTHENTICATED
            with pytest.raises(DLedgerError) as e:
                await ask(liar, RequestCode.METADATA, encode(MetadataRequest(group="a")))
            assert e.value.code == ResponseCode.UNAUTHENTICATED
            return requests_total(server)  # counted before each answer left
        finally:
            for t in (client, stranger, liar):
                await t.close()
            await server.stop()

    series = asyncio.run(main())
    other = ("?", "m0,n0")
    assert series[("a", "n0", "client", "METADATA", "SUCCESS")] == 1
    assert sum(v for k, v in series.items() if k[:4] == ("b", "m0", "member", "VOTE")) == 1
    assert series[(*other, "client", "GET", "UNKNOWN_GROUP")] == MADE_UP_GROUPS
    assert series[(*other, "client", "unknown", "UNSUPPORTED")] == len(UNKNOWN_CODES)
    assert series[(*other, "client", "GET", "UNEXPECTED_ARGUMENT")] == 1
    assert series[("a", "n0", "client", "GET", "UNEXPECTED_ARGUMENT")] == 1
    assert series[(*other, "client", "METADATA", "UNAUTHENTICATED")] == 1
    assert series[(*other, "member", "VOTE", "UNAUTHENTICATED")] == 1
    assert series[(*other, "client", "AUTH", "UNAUTHENTICATED")] == 1
    # bounded: no made-up group name and no unknown code number became a label value
    assert {k[0] for k in series} <= {"a", "b", "?"}
    assert {k[1] for k in series} <= {"n0", "m0", "m0,n0"}
    assert not [k for k in series if k[3].isdigit() or k[2] not in ("client", "member")]
