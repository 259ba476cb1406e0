"""A state machine that raises, embedded in a real one-member server over TCP: the member stops
applying (its state may be half-changed) and says so; nothing waits for ever and no snapshot
is taken of the broken state (review findings 2 and 3 of issue 12)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from dledger import AppliedEntry, AsyncDLedgerClient, DLedgerConfig, DLedgerError, DLedgerServer, StateMachine
from dledger.codes import ResponseCode
from dledger.ports import free_ports
from dledger.statemachine.api import SnapshotReader, SnapshotWriter


class Fragile(StateMachine):
    def __init__(self) -> None:
        self.seen: list[bytes] = []

    def apply(self, entries: Sequence[AppliedEntry]) -> Sequence[bytes]:
        out = []
        for e in entries:
            if e.body == b"boom":
                raise RuntimeError("cannot apply boom")
            self.seen.append(e.body)
            out.append(b"ok:" + e.body)
        return out

    def snapshot(self, writer: SnapshotWriter) -> None:
        with writer.open("seen") as f:
            f.write(b"\n".join(self.seen))

    def restore(self, reader: SnapshotReader | None) -> None:
        self.seen = reader.open("seen").read().split(b"\n") if reader is not None else []

    def query(self, request: bytes) -> bytes:
        return b",".join(self.seen)


def test_a_failing_state_machine_stops_applying_and_answers_everyone(tmp_path: Path) -> None:
    async def main() -> None:
        (port,) = free_ports(1)
        peers = f"n0-127.0.0.1:{port}"
        cfg = DLedgerConfig(self_id="n0", peers=peers, store_dir=str(tmp_path / "n0"))
        server = DLedgerServer(cfg, state_machines={"default": Fragile()})
        await server.start()
        try:
            async with AsyncDLedgerClient(peers, timeout=10) as c:
                assert (await c.propose(b"a")).result == b"ok:a"
                assert await c.query(b"") == b"a"
                with pytest.raises(DLedgerError) as e:
                    await c.propose(b"boom")
                assert e.value.code == ResponseCode.INTERNAL_ERROR and "boom" in e.value.message
                for call in (c.propose(b"b"), c.query(b""), c.snapshot("n0")):
                    with pytest.raises(DLedgerError) as e:
                        await asyncio.wait_for(call, 10)  # an answer, not a client timeout
                    assert e.value.code == ResponseCode.INTERNAL_ERROR, e.value
                meta = await c.metadata("n0")
                assert "boom" in meta.state_machine_error
                assert meta.snapshot_index == -1  # nothing snapshotted of the half-applied state
        finally:
            await server.stop()

    asyncio.run(main())
