"""Index units recovery trusts unread are durable, and a start finds its CONFIG_CHANGE and
SESSION entries from the index's truth, not from a stale or damaged cache of it.

Recovery trusts the index units below the checkpoint's trusted record without reading them
(store/recovery.py, `_check_units`): the checkpoint fsyncs every index file written since the
last one first, not only the newest two. A unit a power loss took anyway (zeros) is damage
that `indexes_with_magic` repairs, as `unit()` does, instead of skipping the entry it hides.
The checkpoint's markers (store/marks.py) count only through its verified trusted record,
and an entry they name is a configuration only when its record says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dledger.core.configs import ConfigHistory
from dledger.entry import MAGIC_CONFIG_CHANGE, MAGIC_SESSION
from dledger.membership import Membership, encode_membership
from dledger.store import mapped_file
from dledger.store.file import FileLedgerStore

UNITS_PER_FILE = 64
KW = {"data_file_size": 1 << 20, "index_file_size": 32 * UNITS_PER_FILE, "checkpoint_interval_ms": 10**9}
REAL = Membership({"n0": "127.0.0.1:1", "n1": "127.0.0.1:2", "n2": "127.0.0.1:3"})
EVIL = Membership({"evil": "10.6.6.6:1"})


def _open(d: Path) -> FileLedgerStore:
    return FileLedgerStore(d, **KW)  # type: ignore[arg-type]


def _index_files(d: Path) -> list[str]:
    return sorted(p.name for p in (d / "index").iterdir())


def _checkpoint_all(s: FileLedgerStore) -> None:
    s.flush()
    s.committed_index = s.end_index
    s.write_checkpoint()


def _edit_checkpoint(d: Path, **changes: object) -> dict[str, object]:
    ck = d / "checkpoint"
    state: dict[str, object] = json.loads(ck.read_text())
    for k, v in changes.items():
        if v is None:
            state.pop(k, None)
        else:
            state[k] = v
    ck.write_text(json.dumps(state))
    return state


def test_the_checkpoint_fsyncs_every_index_file_written_since_the_last_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_sync = mapped_file.MappedFile.sync

    def spy(self: mapped_file.MappedFile) -> None:
        if self.path.parent.name == "index":
            synced.append(self.path.name)
        real_sync(self)

    monkeypatch.setattr(mapped_file.MappedFile, "sync", spy)
    s = _open(tmp_path)
    try:
        s.append_as_leader([b"a"] * 10, 1)
        _checkpoint_all(s)
        synced.clear()
        # the log fills and leaves four index files before the next checkpoint
        s.append_as_leader([b"b"] * (4 * UNITS_PER_FILE), 1)
        s.flush()
        assert synced == []  # the flush (the hot path's fsync) syncs data files only
        _checkpoint_all(s)
        trusted_unit = s.end_index * 32
        written = [n for n in _index_files(tmp_path) if int(n) <= trusted_unit]
        assert len(written) == 5
        assert set(written) <= set(synced), f"index files never fsynced before the checkpoint: {written}"
        # each once: a file the log left is not synced again by later checkpoints
        synced.clear()
        s.append_as_leader([b"c"], 1)
        _checkpoint_all(s)
        assert set(synced) <= {n for n in _index_files(tmp_path) if int(n) + 32 * UNITS_PER_FILE > trusted_unit}
    finally:
        s.close()


def _store_with_a_config_change_in_index_file_0(d: Path) -> int:
    s = _open(d)
    try:
        s.append_as_leader([b"a"] * 10, 1)
        s.append_as_leader([encode_membership(REAL)], 1, MAGIC_CONFIG_CHANGE)
        s.append_as_leader([b"s"], 1, MAGIC_SESSION)
        s.append_as_leader([b"b"] * (4 * UNITS_PER_FILE), 1)
        _checkpoint_all(s)
        return s.end_index
    finally:
        s.close()


def test_a_zeroed_index_file_below_the_trusted_record_is_repaired_by_the_magic_scan(tmp_path: Path) -> None:
    end = _store_with_a_config_change_in_index_file_0(tmp_path)
    # its units lost (a power loss before it was synced, or rot): zeros, at full size
    f = tmp_path / "index" / _index_files(tmp_path)[0]
    f.write_bytes(bytes(f.stat().st_size))
    _edit_checkpoint(tmp_path, markers=None)  # no markers (an older release's checkpoint): a scan
    r = _open(tmp_path)
    try:
        assert r.end_index == end
        assert r.indexes_with_magic(0, r.end_index, MAGIC_CONFIG_CHANGE) == [10]
        assert r.indexes_with_magic(0, r.end_index, MAGIC_SESSION) == [11]
        assert r.raw_unit(0) is not None  # the damaged units were rebuilt, not only read around
        h = ConfigHistory(-1, Membership({"old": "127.0.0.1:9"}))
        assert h.appended(r, r.begin_index, r.end_index)
        assert h.current == REAL
    finally:
        r.close()


def test_a_marker_naming_a_client_entry_is_not_a_configuration(tmp_path: Path) -> None:
    s = _open(tmp_path)
    try:
        s.append_as_leader([b"x"], 1)
        s.append_as_leader([encode_membership(EVIL)], 1)  # an ordinary client append (NORMAL)
        s.append_as_leader([b"y"], 1)
        _checkpoint_all(s)
    finally:
        s.close()
    # a stale / restored / hand-edited checkpoint whose marker names entry 1 as CONFIG_CHANGE
    state = json.loads((tmp_path / "checkpoint").read_text())
    state["markers"][str(MAGIC_CONFIG_CHANGE)] = {"upto": 2, "indexes": [1]}
    _edit_checkpoint(tmp_path, markers=state["markers"])
    s = _open(tmp_path)
    try:
        h = ConfigHistory(-1, REAL)
        assert not h.appended(s, s.begin_index, s.end_index)
        assert h.current == REAL
    finally:
        s.close()


def _config_change_at_1_hidden_by_markers(d: Path) -> dict[str, Any]:
    s = _open(d)
    try:
        s.append_as_leader([b"x"], 1)
        s.append_as_leader([encode_membership(REAL)], 1, MAGIC_CONFIG_CHANGE)
        s.append_as_leader([b"y"], 1)
        _checkpoint_all(s)
    finally:
        s.close()
    state: dict[str, Any] = json.loads((d / "checkpoint").read_text())
    state["markers"][str(MAGIC_CONFIG_CHANGE)] = {"upto": 2, "indexes": []}  # says: none through 2
    return state


def test_markers_past_the_checkpoints_trusted_record_are_not_taken(tmp_path: Path) -> None:
    state = _config_change_at_1_hidden_by_markers(tmp_path)
    s = _open(tmp_path)
    try:
        t = s.unit(1)
        chain = s.chain_at(1)
    finally:
        s.close()
    # the checkpoint trusts entry 1, yet its markers claim to know through 2
    _edit_checkpoint(tmp_path, markers=state["markers"],
                     trusted={"index": 1, "term": t[4], "pos": t[1], "chain_crc": chain})
    s = _open(tmp_path)
    try:
        assert s.indexes_with_magic(0, s.end_index, MAGIC_CONFIG_CHANGE) == [1]
    finally:
        s.close()


def test_markers_of_a_checkpoint_without_a_trusted_record_are_not_taken(tmp_path: Path) -> None:
    state = _config_change_at_1_hidden_by_markers(tmp_path)
    state["trusted"] = None
    (tmp_path / "checkpoint").write_text(json.dumps(state))
    s = _open(tmp_path)
    try:
        assert s.indexes_with_magic(0, s.end_index, MAGIC_CONFIG_CHANGE) == [1]
    finally:
        s.close()


def test_markers_within_the_trusted_record_are_still_taken(tmp_path: Path) -> None:
    # the cache still works: a start with good markers answers without a scan
    _config_change_at_1_hidden_by_markers(tmp_path)
    s = _open(tmp_path)
    try:
        assert s._marks[MAGIC_CONFIG_CHANGE].upto == s.end_index
        assert s.indexes_with_magic(0, s.end_index, MAGIC_CONFIG_CHANGE) == [1]
    finally:
        s.close()
