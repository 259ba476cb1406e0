"""Reading and writing broker sets (controller mode) from Spark tasks.

A broker set's readable end is its master's confirm offset (as the index of the last record
within it): a record past it may still be cut by a failover, so no row shows it. Ranges are
read through BrokerClient, which asks the master and falls back to another replica; a replica
whose confirm offset lags answers short, and the task asks again until its deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa

from dledger.broker.client import BrokerClient
from dledger.codes import DLedgerError, ResponseCode
from dledger.spark.online import DataLossError, RangeReadSpec
from dledger.spark.retry import Retry, describe
from dledger.spark.schema import entry_batch

log = logging.getLogger(__name__)

READ_CHUNK = 2000


def broker_bounds(client: BrokerClient, broker: str, timeout: float) -> tuple[int, int]:
    """(begin index, confirmed end index, exclusive) at the master, retried through a failover."""
    attempt = Retry(f"broker set {broker}: asking the master for the confirmed records", timeout)
    while True:
        try:
            info = client.info()
        except DLedgerError as e:
            # UNKNOWN: the controllers name no master yet
            attempt.failed(e, retryable=True if e.code == ResponseCode.UNKNOWN else None)
            continue
        if info.role == "MASTER":
            return info.begin_index, info.confirmed_index + 1
        attempt.wait(f"{info.broker_id} is {info.role}")


def read_broker_range(spec: RangeReadSpec) -> Iterator[pa.RecordBatch]:
    """Confirmed records of broker set `spec.group` with index in [start, end)."""
    if spec.end <= spec.start:
        return
    client = spec.client.broker_client(spec.peers, spec.group)
    try:
        index = spec.start
        attempt: Retry | None = None  # the read at `index`: each read gets the whole deadline
        while index < spec.end:
            if attempt is None:
                attempt = Retry(f"broker set {spec.group}: read at {index} (range [{spec.start}, {spec.end}))",
                                spec.timeout)
            try:
                records = client.read(index, min(READ_CHUNK, spec.end - index))
            except DLedgerError as e:
                if e.code == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN:
                    raise DataLossError(f"broker set {spec.group}: records from {index} are no longer kept") from e
                attempt.failed(e)
                continue
            rows = [r for r in records if index <= r.index < spec.end]
            if rows:
                yield entry_batch(spec.group, [r.index for r in rows], [r.epoch for r in rows],
                                  [r.offset for r in rows], [r.body for r in rows])
                index = rows[-1].index + 1
                attempt = None
            else:  # the replica that answered has not confirmed them yet
                attempt.wait(f"records [{index}, {spec.end}) not confirmed by the replica that answered")
    finally:
        client.close()


def send_bodies(client: BrokerClient, broker: str, bodies: list[bytes]) -> tuple[int, int]:
    """(first index, last index) of `bodies` sent as one batch (RuntimeError naming the set)."""
    try:
        results = client.send_batch(bodies)
    except DLedgerError as e:
        raise RuntimeError(f"dledger: send of {len(bodies)} records to broker set {broker} failed: "
                           f"{describe(e)}") from e
    return results[0].index, results[-1].index
