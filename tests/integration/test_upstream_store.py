"""A member started on a store upstream DLedger wrote (its own DLedgerMmapFileStore, the
fixture beside the repository), in upstream's layout `<storeBaseDir>/dledger-<selfId>/`, with
two empty members: its log is served intact, the group elects it in a term above upstream's,
appends go on, the empty members fetch upstream's records (unverified: CRC fields 0), and
`currterm` ends in upstream's Properties form with the new term. Real processes over TCP."""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from dledger.store.properties import parse_properties

from .harness import Cluster, dump_store, read_all, wait_until

FIXTURE = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "upstream-dledger-store"
UPSTREAM_TERM = 4  # the fixture's currterm and last entry's term

pytestmark = pytest.mark.skipif(
    not (FIXTURE / "dledger-n0").is_dir(),
    reason=f"upstream DLedger's store fixture is not at {FIXTURE} (shared/fixtures beside the repository)",
)


@dataclass(frozen=True)
class Expected:
    index: int
    term: int
    pos: int
    magic: int
    size: int
    sha256: str


def expected() -> list[Expected]:
    """What upstream's own get(i) returned for every index (expected.tsv)."""
    out = []
    for line in (FIXTURE / "expected.tsv").read_text().splitlines():
        index, term, pos, magic, size, _blen, _crc, sha = line.split("\t")
        out.append(Expected(int(index), int(term), int(pos), int(magic), int(size), sha))
    return out


def copy_fixture(dest: Path) -> None:
    shutil.copytree(FIXTURE / "dledger-n0", dest)
    for p in [dest, *dest.rglob("*")]:  # the fixture is read-only; the member writes its copy
        p.chmod(0o755 if p.is_dir() else 0o644)


def test_a_member_on_upstreams_store_joins_with_its_log_intact(tmp_path: Path) -> None:
    want = expected()
    last = want[-1].index
    data_dir = tmp_path / "cluster"
    base = data_dir / "it" / "n0"  # what n0 is given as --store-dir: upstream's storeBaseDir
    copy_fixture(base / "dledger-n0")
    # new members' files must be the size of the upstream store's (positions are shared): the
    # configured size applies to new stores only, so n0 opens its 64 KiB files as they are
    toml = tmp_path / "member.toml"
    toml.write_text("data_file_size = 65536\n")
    c = Cluster(3, data_dir, group="it", extra=["--config", str(toml)])
    try:
        # n0 with one empty member first: two empty members would be a majority that could
        # elect an empty leader, and Raft would then replace n0's log by that leader's
        c.start_members(["n0", "n1"])
        lead = c.wait_leader(["n0", "n1"], timeout=60)
        assert lead == "n0", "the only member holding a log must lead"
        c.start_members(["n2"])
        wait_until(lambda: c.meta("n2") is not None, 30, "n2 answers")
        meta = c.leader_meta()
        assert meta.self_id == "n0" and meta.term > UPSTREAM_TERM, meta

        # n0 used upstream's layout: nothing was created beside dledger-n0
        assert not (base / "data").exists() and (base / "dledger-n0" / "data").is_dir()

        # every index upstream wrote, read online from the leader: term, pos, magic, body
        client = c.client(timeout=10)
        for e in want:
            got = client.get(e.index)
            assert (got.index, got.term, got.pos, got.magic) == (e.index, e.term, e.pos, e.magic), (e, got)
            assert hashlib.sha256(got.body).hexdigest() == e.sha256, e

        # new appends commit and replicate on top of upstream's records
        results = client.append_batch([f"after-upstream-{k}".encode() for k in range(40)])
        assert [r.index for r in results] == list(range(last + 2, last + 42))  # after the new leader's NOOP
        end = c.wait_caught_up(timeout=120)
        assert end == last + 41

        # the followers fetched upstream's records (CRC fields 0, read unverified) and serve them
        for m in ("n1", "n2"):
            for e in want:
                got = client.get(e.index, member=m)
                assert (got.term, got.magic) == (e.term, e.magic) and \
                    hashlib.sha256(got.body).hexdigest() == e.sha256, (m, e)
        # the read path (chain checks across records) on every member: upstream's NORMAL entries and the new ones
        normal = {e.index: (e.term, e.sha256) for e in want if e.magic == 1}
        readers: list[str | None] = [None, "n0", "n1", "n2"]  # the leader's linearizable read, each member's own
        for r_m in readers:
            got_all = read_all(client, member=r_m)
            assert {i: (t, hashlib.sha256(b).hexdigest()) for i, (t, b) in got_all.items() if i <= last} == normal, r_m
            assert [got_all[r.index][1] for r in results] == [f"after-upstream-{k}".encode() for k in range(40)], r_m
        final = c.leader_meta()
        c.stop()
    finally:
        c.cleanup()

    # offline: the three logs are the same, entry for entry (chain CRCs included)
    dumps = {m: dump_store(c.store_dir(m) if m != "n0" else base / "dledger-n0") for m in c.ids}
    ref = dumps["n0"].entries
    assert len(ref) == last + 42 and ref[: last + 1] and all(
        (s.index, s.term, s.magic, hashlib.sha256(s.body).hexdigest()) == (e.index, e.term, e.magic, e.sha256)
        for s, e in zip(ref, want, strict=False))
    for m in ("n1", "n2"):
        assert dumps[m].entries == ref, m

    # the store's files kept their size; the new members' have the configured one
    for f in (base / "dledger-n0" / "data").iterdir():
        assert f.stat().st_size == 65536, f
    assert [f.stat().st_size for f in (base / "dledger-n0" / "index").iterdir()] == [32768]
    assert all(f.stat().st_size == 65536 for f in (c.store_dir("n1") / "data").iterdir())

    # currterm: upstream's Properties form, with the group's new term
    raw = (base / "dledger-n0" / "currterm").read_bytes()
    props = parse_properties(raw)
    assert not raw.lstrip().startswith(b"{") and int(props["currTerm"]) >= final.term > UPSTREAM_TERM, raw
    assert props.get("voteLeader") in ("", "n0"), raw
