"""A broker set's commit log retention on real processes (docs/brokers.md, "Retention"):
1 MiB data files and `file_reserved_hours = 0` (every full file has expired), checked every
200 ms. Once both replicas hold and have confirmed the records, their old files go: reads
below the new min index get INDEX_LESS_THAN_LOCAL_BEGIN, reads above still work, the slave
stays in sync and in the SyncStateSet, and a slave restarted afterwards catches up."""

from __future__ import annotations

from pathlib import Path

import pytest

from dledger.broker.local import local_broker_cluster
from dledger.codes import DLedgerError, ResponseCode
from dledger.ports import free_port_run

from .harness import wait_until

pytestmark = pytest.mark.integration

BODY = 60 << 10  # 17 records a 1 MiB file


def body(i: int) -> bytes:
    return b"%06d" % i + b"r" * (BODY - 6)


def test_retention_deletes_confirmed_files_and_reads_below_get_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("data_file_size = 1048576\nfile_reserved_hours = 0\nretention_check_interval_ms = 200\n")
    base = free_port_run(3 + 2 * 2)
    with local_broker_cluster(tmp_path, controllers=3, broker_sets=1, replicas=2, base_port=base,
                              broker_args=["--all-ack-in-sync-state-set", "--config", str(config)]) as d:
        master = wait_until(lambda: d.master_of("b0"), 30, "a master")
        slave = next(k for k in d.brokers if k != master)
        wait_until(lambda: len(d.info(master).sync_state_set) == 2, 30, "SyncStateSet of 2")
        with d.client("b0", timeout=10.0) as c:
            for i in range(70):  # 4+ data files
                c.send(body(i))
            wait_until(lambda: all(d.info(k).begin_index >= 34 for k in (master, slave)), 60,
                       "both replicas deleted their first files")
            wait_until(lambda: all(d.info(k).confirmed_index == 69 for k in (master, slave)), 30,
                       "both replicas confirmed every record")
            for k in (master, slave):
                address = d.specs[k].address
                begin = d.info(k).begin_index
                with pytest.raises(DLedgerError) as e:
                    c.read(0, 10, replica=address)
                assert e.value.code == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN
                with pytest.raises(DLedgerError) as e:
                    c.read(begin - 1, 10, replica=address)
                assert e.value.code == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN
                got = c.read(begin, 100, replica=address)
                assert [r.index for r in got][:1] == [begin] and got[0].body == body(begin)
                assert got[-1].body == body(69)
            # the slave stays in sync and in the set
            for i in range(70, 80):
                c.send(body(i))
            wait_until(lambda: d.info(slave).max_offset == d.info(master).max_offset, 30, "the slave caught up")
            assert sorted(d.info(master).sync_state_set) == sorted({d.info(master).broker_id,
                                                                     d.info(slave).broker_id})
            # a slave restarted after retention catches up from where it was
            d.stop_broker(slave)
            for i in range(80, 100):
                c.send(body(i))
            d.start_broker(slave)
            wait_until(lambda: d.info(slave).max_offset == d.info(master).max_offset, 60, "the restarted slave")
            assert [r.body for r in c.read(95, 10, replica=d.specs[slave].address)] == [body(i) for i in range(95, 100)]
