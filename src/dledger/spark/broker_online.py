"""Reading and writing broker sets (controller mode) from Spark tasks.

A broker set's readable end is its master's confirm offset (as the index of the last record
within it): a record past it may still be cut by a failover, so no row shows it. Ranges are
read through BrokerClient, which asks the master and falls back to another replica; a replica
whose confirm offset lags answers short, and the task asks again until its deadline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pyarrow as pa

from dledger.broker.client import BrokerClient
from dledger.codes import DLedgerError, ResponseCode
from dledger.spark.online import DataLossError, RangeReadSpec, describe
from dledger.spark.schema import entry_batch

log = logging.getLogger(__name__)

READ_CHUNK = 2000
_TRANSIENT = {ResponseCode.TIMEOUT, ResponseCode.NETWORK_ERROR, ResponseCode.SERVICE_NOT_AVAILABLE}


def broker_bounds(client: BrokerClient, broker: str, timeout: float) -> tuple[int, int]:
    """(begin index, confirmed end index, exclusive) at the master, retried through a failover."""
    deadline = time.monotonic() + timeout
    delay = 0.1
    while True:
        try:
            info = client.info()
            if info.role == "MASTER":
                return info.begin_index, info.confirmed_index + 1
            error = DLedgerError(ResponseCode.SERVICE_NOT_AVAILABLE, f"{info.broker_id} is {info.role}")
        except DLedgerError as e:
            if e.code not in _TRANSIENT and e.code != ResponseCode.UNKNOWN:
                raise
            error = e
        if time.monotonic() >= deadline:
            raise DLedgerError(error.code, f"broker set {broker}: no master answered within {timeout:.0f} s: "
                                           f"{describe(error)}")
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def read_broker_range(spec: RangeReadSpec) -> Iterator[pa.RecordBatch]:
    """Confirmed records of broker set `spec.group` with index in [start, end)."""
    if spec.end <= spec.start:
        return
    deadline = time.monotonic() + spec.timeout
    client = spec.client.broker_client(spec.peers, spec.group)
    try:
        index = spec.start
        while index < spec.end:
            try:
                records = client.read(index, min(READ_CHUNK, spec.end - index))
            except DLedgerError as e:
                if e.code == ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN:
                    raise DataLossError(f"broker set {spec.group}: records from {index} are no longer kept") from e
                if e.code not in _TRANSIENT or time.monotonic() >= deadline:
                    raise DLedgerError(e.code, f"broker set {spec.group}: read at {index} failed: "
                                               f"{describe(e)}") from e
                time.sleep(0.2)
                continue
            rows = [r for r in records if index <= r.index < spec.end]
            if rows:
                yield entry_batch(spec.group, [r.index for r in rows], [r.epoch for r in rows],
                                  [r.offset for r in rows], [r.body for r in rows])
                index = rows[-1].index + 1
            elif time.monotonic() >= deadline:
                raise DLedgerError(ResponseCode.TIMEOUT, f"broker set {spec.group}: records [{index}, {spec.end}) "
                                                         f"not confirmed by any replica within {spec.timeout:.0f} s")
            else:
                time.sleep(0.1)  # the replica that answered has not confirmed them yet
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
