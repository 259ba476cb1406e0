"""InstallSnapshot's byte stream (statemachine/install.py): a snapshot read in chunks and
written back in order arrives whole and verified; chunks out of order or damaged are refused
with the offset to resume at; forged file names are refused; an abort leaves nothing."""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import pytest

from dledger.kv.commands import Put, encode
from dledger.kv.machine import KVStateMachine
from dledger.statemachine.api import AppliedEntry, SnapshotReader, SnapshotWriter, StateMachine
from dledger.statemachine.install import InstallSink, SnapshotSource
from dledger.statemachine.snapshot import FileInfo, SnapshotError, SnapshotMeta, SnapshotStore


class Files(StateMachine):
    """A state machine made of a few files of given sizes (one empty)."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes

    def apply(self, entries):  # type: ignore[no-untyped-def]
        return [b""] * len(entries)

    def snapshot(self, writer: SnapshotWriter) -> None:
        rng = random.Random(7)
        for name, size in self.sizes.items():
            with writer.open(name) as f:
                f.write(rng.randbytes(size))

    def restore(self, reader: SnapshotReader | None) -> None:
        return None


def _leader_snapshot(tmp_path: Path, sm: StateMachine) -> tuple[SnapshotMeta, Path]:
    store = SnapshotStore(tmp_path / "leader")
    meta = store.take(sm, 41, 3, 1234, "n0-x", next_pos=9876)
    return meta, store.dir / f"{41:020d}"


def test_a_snapshot_streams_in_chunks_resumes_and_arrives_whole(tmp_path: Path) -> None:
    meta, src_dir = _leader_snapshot(tmp_path, Files({"a": 3_000_001, "b": 0, "c": 70_000}))
    assert meta.next_pos == 9876
    src = SnapshotSource(src_dir, meta)
    follower = SnapshotStore(tmp_path / "follower")
    sink = InstallSink(follower, meta)
    offset, sent = 0, 0
    while not sink.done:
        data = src.read(offset, 1 << 20)
        if sent == 2:  # a chunk lost on a dropped connection: the next one is refused...
            offset += len(data)
            data = src.read(offset, 1 << 20)
        got = sink.write(offset, data, zlib.crc32(data))
        assert got == offset + len(data) or (sent == 2 and got < offset)
        offset, sent = got, sent + 1  # ...and the leader resumes where the follower says
    assert sink.write(0, b"x", zlib.crc32(b"x")) == sink.total  # a stale chunk changes nothing
    installed, reader = sink.finish()
    assert installed == meta and sorted(reader.names()) == ["a", "b", "c"]
    for name in ("a", "b", "c"):
        assert (follower.dir / f"{41:020d}" / name).read_bytes() == (src_dir / name).read_bytes()
    assert not list(follower.dir.glob(".tmp-*"))


def test_a_damaged_chunk_is_refused_and_a_wrong_file_fails_the_install(tmp_path: Path) -> None:
    sm = KVStateMachine()
    sm.apply([AppliedEntry(i, 1, encode(Put(b"k%d" % i, b"v" * 100))) for i in range(500)])
    meta, src_dir = _leader_snapshot(tmp_path, sm)
    src = SnapshotSource(src_dir, meta)
    sink = InstallSink(SnapshotStore(tmp_path / "f"), meta)
    data = src.read(0, 1 << 20)
    assert sink.write(0, data[:-1] + b"\x00", zlib.crc32(data)) == 0  # CRC mismatch: refused
    forged = bytearray(data)
    forged[5] ^= 1  # damaged with a matching chunk CRC (the sender's bug): the file CRC catches it
    assert sink.write(0, bytes(forged), zlib.crc32(bytes(forged))) == len(data)
    with pytest.raises(SnapshotError, match="CRC"):
        sink.finish()
    assert not list((tmp_path / "f" / "snapshot").iterdir())  # nothing half-installed


def test_a_meta_naming_a_path_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    meta = SnapshotMeta(5, 1, 0, "", {"../../escape": FileInfo(3, 0)})
    with pytest.raises(SnapshotError, match="bad file names"):
        InstallSink(SnapshotStore(tmp_path / "f"), meta)
    assert not (tmp_path / "escape").exists()


def test_an_install_declaring_more_than_the_disk_has_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forged meta declaring 2**61 bytes wrote 544 MB in 3 s: the declared total must fit in
    the store's free space less a margin, and no chunk goes past what the meta declares. The
    refusal says "No space left", which the follower's node answers DISK_FULL (test_node_limits)."""
    from dledger.statemachine import install

    store = SnapshotStore(tmp_path / "f")
    forged = SnapshotMeta(1_000_000, 1, 0, "", {"a": FileInfo(1 << 61, 0)})
    with pytest.raises(install.InstallSpaceError, match="No space left"):
        InstallSink(store, forged)
    assert not list(store.dir.iterdir())  # not even its temporary directory
    monkeypatch.setattr(install, "free_bytes", lambda _: install.SPACE_MARGIN_BYTES + 10)
    with pytest.raises(install.InstallSpaceError):
        InstallSink(store, SnapshotMeta(7, 1, 0, "", {"a": FileInfo(6, 0), "b": FileInfo(5, 0)}))
    sink = InstallSink(store, SnapshotMeta(7, 1, 0, "", {"a": FileInfo(6, zlib.crc32(b"abcdef")),
                                                         "b": FileInfo(4, zlib.crc32(b"ghij"))}))
    with pytest.raises(SnapshotError, match="runs past"):
        sink.write(0, b"abcdefghijk", zlib.crc32(b"abcdefghijk"))  # one byte past the declared total
    assert sink.received == 0 and not list(sink.tmp.iterdir())
    assert sink.write(0, b"abcdefgh", zlib.crc32(b"abcdefgh")) == 8
    assert (sink.tmp / "a").read_bytes() == b"abcdef"  # a file gets its declared size, the rest goes on
    assert sink.write(8, b"ij", zlib.crc32(b"ij")) == 10 and sink.finish()[0].size == 10


def test_the_benchmark_blob_machine_snapshots_restores_and_streams(tmp_path: Path) -> None:
    """BlobMachine (benchmarks/install_snapshot.py): a tiny entry grows the state; its snapshot
    is that many bytes in files of at most 256 MiB; it travels as a stream and restores."""
    from dledger.bench import blob_machine
    from dledger.bench.blob_machine import BlobMachine

    sm = BlobMachine()
    sm.apply([AppliedEntry(0, 1, b"grow:%d" % (3 << 20)), AppliedEntry(1, 1, b"junk"),
              AppliedEntry(2, 1, b"grow:12345")])
    assert sm.size == (3 << 20) + 12345
    meta = SnapshotStore(tmp_path / "a").take(sm, 2, 1, 77, "n0-127.0.0.1:1", next_pos=0)
    assert meta.size == sm.size + len(str(sm.size))
    src = SnapshotSource(tmp_path / "a" / "snapshot" / f"{2:020d}", meta)
    sink = InstallSink(SnapshotStore(tmp_path / "b"), meta)
    offset = 0
    while offset < meta.size:
        data = src.read(offset, 1 << 20)
        offset = sink.write(offset, data, zlib.crc32(data))
    _, reader = sink.finish()
    other = BlobMachine()
    other.restore(reader)
    assert other.size == sm.size and other.query(b"") == str(sm.size).encode()
    assert blob_machine.parse_grow(b"grow:-1") == 0
