"""The offline reader on stopped members, and `dledger audit`."""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from dledger.cli import cli
from dledger.clitools import emit
from dledger.entry import HEADER, HEADER_SIZE, chain_crc
from dledger.spark.audit import run_audit
from integration.harness import wait_until

from .helpers import read_all, start_group

pytestmark = pytest.mark.spark

FILE_SIZE = 65536  # small data files: the log spans several, so chains are checked across files


@dataclass
class Stopped:
    group: str
    dirs: dict[str, Path]  # member -> store dir
    rows: list[tuple[str, int, int, int, bytes]]  # the online read before the stop
    committed: dict[str, int]  # member -> committed index in its checkpoint after the stop


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stopped]:
    base = tmp_path_factory.mktemp("offline")
    cluster, g = start_group(base, name="audit", config={"data_file_size": FILE_SIZE,
                                                         "index_file_size": 32 * 4096})
    try:
        for k in range(12):
            g.client.append_batch([f"offline-{k}-{i}-".encode() * (1 + i % 4) for i in range(250)])
        rows = [(g.name, e.index, e.term, e.pos, e.body) for e in read_all(g.client)]
        end = g.committed_next() - 1
        members = list(cluster.procs)
        # followers learn the commit index a moment later: stop once each has it
        wait_until(lambda: all(g.client.metadata(member=m).committed_index >= end for m in members),
                   60, "every member committed the whole log")
    finally:
        g.client.close()
        cluster.__exit__()
    dirs = {m: base / g.name / m for m in members}
    committed = {m: json.loads((d / "checkpoint").read_text())["committed_index"] for m, d in dirs.items()}
    assert min(committed.values()) >= end
    yield Stopped(g.name, dirs, rows, committed)


def _read(spark: SparkSession, path: Path, **options: str) -> list[tuple[str, int, int, int, bytes]]:
    reader = spark.read.format("dledger-files")
    for k, v in options.items():
        reader = reader.option(k, v)
    rows = reader.load(str(path)).collect()
    return sorted((r["group"], r["index"], r["term"], r["pos"], bytes(r["body"])) for r in rows)


def test_offline_read_equals_online_read(spark: SparkSession, stopped: Stopped) -> None:
    for member, d in stopped.dirs.items():
        assert len(list((d / "data").iterdir())) >= 3, "the log should span several data files"
        assert _read(spark, d) == stopped.rows, member
    df = spark.read.format("dledger-files").load(str(stopped.dirs["n0"]))
    assert df.schema.simpleString() == "struct<group:string,index:bigint,term:bigint,pos:bigint,body:binary>"
    assert df.rdd.getNumPartitions() >= 3  # one per data file


def _copy_store(src: Path, dst: Path) -> Path:
    (dst / "data").mkdir(parents=True)
    for f in (src / "data").iterdir():
        shutil.copy(f, dst / "data" / f.name)
    shutil.copy(src / "checkpoint", dst / "checkpoint")
    return dst


def test_committed_index_bounds_the_read(spark: SparkSession, stopped: Stopped, tmp_path: Path) -> None:
    d = _copy_store(stopped.dirs["n1"], tmp_path / stopped.group / "n1")
    ckpt = json.loads((d / "checkpoint").read_text())
    cut = stopped.rows[len(stopped.rows) // 2][1]
    ckpt["committed_index"] = cut
    (d / "checkpoint").write_text(json.dumps(ckpt))
    assert _read(spark, d) == [r for r in stopped.rows if r[1] <= cut]
    assert _read(spark, d, includeUncommitted="true") == stopped.rows


def _flip_body_byte(store: Path, pos: int) -> tuple[Path, int]:
    """Flip the first body byte of the record at logical position `pos`."""
    start = pos // FILE_SIZE * FILE_SIZE
    path = store / "data" / f"{start:020d}"
    offset = pos - start
    with open(path, "r+b") as f:
        f.seek(offset + 48)
        b = f.read(1)
        f.seek(offset + 48)
        f.write(bytes([b[0] ^ 0x01]))
    return path, offset


def test_corrupt_record_names_file_and_offset(spark: SparkSession, stopped: Stopped, tmp_path: Path) -> None:
    d = _copy_store(stopped.dirs["n2"], tmp_path / stopped.group / "n2")
    _, index, _, pos, _ = stopped.rows[len(stopped.rows) * 2 // 3]
    path, offset = _flip_body_byte(d, pos)
    with pytest.raises(Exception, match=rf"{path}: corrupt record at offset {offset} \(index {index} expected\): "
                                        "body crc mismatch"):
        spark.read.format("dledger-files").load(str(d)).collect()


def test_lost_committed_tail_is_reported(spark: SparkSession, stopped: Stopped, tmp_path: Path) -> None:
    d = _copy_store(stopped.dirs["n0"], tmp_path / stopped.group / "n0")
    _, index, _, pos, _ = stopped.rows[-1]
    last = max((d / "data").iterdir())
    with open(last, "r+b") as f:  # the last committed record is gone (zeroed)
        f.seek(pos % FILE_SIZE)
        f.write(bytes(48 + len(stopped.rows[-1][4])))
    with pytest.raises(Exception, match=rf"the log ends at index {index - 1}, but the checkpoint has committed "
                                        rf"index {stopped.committed['n0']}"):
        spark.read.format("dledger-files").load(str(d)).collect()


def test_audit_reports_agreement(spark: SparkSession, stopped: Stopped) -> None:
    dirs = [str(d) for d in stopped.dirs.values()]
    result = CliRunner().invoke(cli, ["audit", *dirs])
    assert result.exit_code == 0, result.output
    # the highest index held by at least two members (normally all three committed the same)
    agree = sorted(stopped.committed.values())[1]
    assert f"agree up to index {agree}" in result.stdout
    assert "audit [" in result.stderr and "audit [" not in result.stdout  # progress stays off stdout

    result = CliRunner().invoke(cli, ["audit", *dirs, "-o", "json"])  # the active session: no new JVM
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # one object, nothing else on stdout
    assert report["ok"] is True and report["agree_up_to"] == agree and report["divergence"] is None
    assert [(m["member"], m["path"], m["first_index"]) for m in report["members"]] == [
        (m, str(d), 0) for m, d in stopped.dirs.items()]
    assert all(m["last_index"] >= agree and m["records"] == m["last_index"] + 1 and m["errors"] == 0
               for m in report["members"]), report["members"]


def test_audit_finds_a_flipped_byte(spark: SparkSession, stopped: Stopped, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    flipped = _copy_store(stopped.dirs["n1"], tmp_path / "copy" / "n1")
    _, index, _, pos, _ = stopped.rows[len(stopped.rows) // 3]
    path, offset = _flip_body_byte(flipped, pos)
    dirs = [stopped.dirs["n0"], flipped, stopped.dirs["n2"]]

    report = run_audit(spark, dirs)
    assert not report.ok
    assert report.divergence_index == index and report.agree_up_to == index - 1
    bad = [c for c in report.copies if c.error]
    assert [(c.member, c.file, c.file_offset) for c in bad] == [("n1", str(path), offset)]
    assert "body crc mismatch" in (bad[0].error or "")

    result = CliRunner().invoke(cli, ["audit", *map(str, dirs)])
    assert result.exit_code == 1, result.output
    assert f"first divergence at index {index}" in result.output
    assert "n1: INVALID: body crc mismatch" in result.output

    result = CliRunner().invoke(cli, ["audit", *map(str, dirs), "-o", "json"])
    assert result.exit_code == 1, result.output  # the same exit code as the text
    out = json.loads(result.stdout)  # one object, nothing else on stdout
    assert out["ok"] is False and out["agree_up_to"] == index - 1
    assert [m["member"] for m in out["members"]] == ["n0", "n1", "n2"]
    assert out["divergence"]["index"] == index
    copies = {c["member"]: c for c in out["divergence"]["copies"]}
    assert (copies["n1"]["file"], copies["n1"]["file_offset"]) == (str(path), offset)
    assert "body crc mismatch" in copies["n1"]["error"] and copies["n0"]["error"] is None
    assert copies["n0"]["chain_crc"] == copies["n2"]["chain_crc"]
    assert out == report.record()

    # what -o table prints, from the report above (no third Spark run for it)
    monkeypatch.setenv("COLUMNS", "400")  # a wide table: each cell on one line
    emit(report.rows(), "table", report.verdict())
    table = capsys.readouterr().out
    assert f"first divergence at index {index}" in table and "INVALID: body crc mismatch" in table


def test_audit_finds_a_resealed_record(spark: SparkSession, stopped: Stopped, tmp_path: Path) -> None:
    """A record changed with valid CRCs (what a diverged member would hold): the chain
    CRC differs from the other members' at that index, and nowhere before."""
    other = _copy_store(stopped.dirs["n2"], tmp_path / "copy" / "n2")
    _, index, _, pos, _ = stopped.rows[len(stopped.rows) // 2]
    path = other / "data" / f"{pos // FILE_SIZE * FILE_SIZE:020d}"
    offset = pos % FILE_SIZE
    with open(path, "r+b") as f:
        f.seek(offset)
        head = list(HEADER.unpack(f.read(HEADER_SIZE)))
        body = bytearray(f.read(head[8]))
        body[0] ^= 0x01
        prev_chain = _chain_before(path, offset)
        head[7] = zlib.crc32(body)
        head[6] = chain_crc(head[2], head[3], head[7], prev_chain)
        f.seek(offset)
        f.write(HEADER.pack(*head) + bytes(body))
    report = run_audit(spark, [stopped.dirs["n0"], stopped.dirs["n1"], other])
    assert report.divergence_index == index
    at = {c.member: c for c in report.copies}
    assert at["n0"].chain_crc == at["n1"].chain_crc != at["n2"].chain_crc
    assert at["n2"].error is None  # the record itself is sound: it differs


def _chain_before(path: Path, offset: int) -> int:
    """The chain CRC of the record before the one at `offset` (walking the file's headers)."""
    data = path.read_bytes()
    off, chain = 0, 0
    while off < offset:
        h = HEADER.unpack_from(data, off)
        chain = h[6]
        off += h[1]
    assert off == offset and chain != 0, "the record should not be the first of its file"
    return chain
