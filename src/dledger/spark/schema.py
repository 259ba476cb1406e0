"""The row schema of both sources (docs/spark.md) and its Arrow twin.

The Arrow schema must equal what Spark derives from the DDL (nullable fields,
`string`/`binary` rather than the large variants), or Spark refuses the batches.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from dledger.runtime.client import EntryColumns

ENTRY_SCHEMA = "group string, index long, term long, pos long, body binary"

# Optional (option includeTimestamp, or named in a declared schema): when the source planned the
# read or micro-batch that holds the row. The record format has no timestamp, so this is the
# reader's clock, not a producer's or the leader's (docs/spark.md, "The timestamp column").
TIMESTAMP_COLUMN = "timestamp timestamp"
TIMESTAMP_FIELD = pa.field("timestamp", pa.timestamp("us", tz="UTC"))

ARROW_ENTRY_SCHEMA = pa.schema(
    [
        pa.field("group", pa.string()),
        pa.field("index", pa.int64()),
        pa.field("term", pa.int64()),
        pa.field("pos", pa.int64()),
        pa.field("body", pa.binary()),
    ]
)

# One row per record of a store directory, with what validation found (format
# "dledger-files", mode "records"; what `dledger audit` compares).
RECORD_SCHEMA = (
    "member string, group string, index long, term long, pos long, magic int, chain_crc long, "
    "body_crc long, body_size int, file string, file_offset long, error string"
)

ARROW_RECORD_SCHEMA = pa.schema(
    [
        pa.field("member", pa.string()),
        pa.field("group", pa.string()),
        pa.field("index", pa.int64()),
        pa.field("term", pa.int64()),
        pa.field("pos", pa.int64()),
        pa.field("magic", pa.int32()),
        pa.field("chain_crc", pa.int64()),
        pa.field("body_crc", pa.int64()),
        pa.field("body_size", pa.int32()),
        pa.field("file", pa.string()),
        pa.field("file_offset", pa.int64()),
        pa.field("error", pa.string()),
    ]
)


def entry_batch(group: str, indexes: Sequence[int], terms: Sequence[int], positions: Sequence[int],
                bodies: Sequence[bytes]) -> pa.RecordBatch:
    """Columns straight into Arrow: no per-row tuple and no per-value type check by Spark."""
    n = len(indexes)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([group] * n, pa.string()),
            pa.array(indexes, pa.int64()),
            pa.array(terms, pa.int64()),
            pa.array(positions, pa.int64()),
            pa.array(bodies, pa.binary()),
        ],
        schema=ARROW_ENTRY_SCHEMA,
    )


def columns_batch(group: str, cols: EntryColumns, rows: int | None = None) -> pa.RecordBatch:
    """The first `rows` (default: all) entries of a columnar READ answer as an entry batch: its
    buffers become the Arrow columns as they are, no Python object per row."""
    return buffers_batch(group, cols.count if rows is None else rows, cols.indexes, cols.terms, cols.positions,
                         cols.body_ends, cols.bodies)


def buffers_batch(group: str, n: int, indexes: bytes, terms: bytes, positions: bytes, body_ends: bytes,
                  bodies: bytes) -> pa.RecordBatch:
    """`n` entries laid out as a columnar READ answer lays them out (little-endian int64
    columns, int32 body ends from 0, the bodies joined) as an entry batch, buffers as they are."""
    bufs = [indexes, terms, positions, body_ends]
    if sys.byteorder == "big":  # the wire is little-endian, Arrow native
        swapped = []
        for b, code in zip(bufs, "qqqi", strict=True):
            a = array(code)
            a.frombytes(b)
            a.byteswap()
            swapped.append(a.tobytes())
        bufs = swapped
    index, term, pos, ends = (pa.py_buffer(b) for b in bufs)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(group, pa.string()), n),
            pa.Array.from_buffers(pa.int64(), n, [None, index]),
            pa.Array.from_buffers(pa.int64(), n, [None, term]),
            pa.Array.from_buffers(pa.int64(), n, [None, pos]),
            pa.Array.from_buffers(pa.binary(), n, [None, ends, pa.py_buffer(bodies)]),
        ],
        schema=ARROW_ENTRY_SCHEMA,
    )


_SPARK_TYPE = {"long": "bigint", "int": "int", "string": "string", "binary": "binary",
               "timestamp": "timestamp"}  # DDL -> simpleString


class SchemaError(ValueError):
    """A declared schema a source cannot return."""


def constant_timestamps(ms: int, n: int) -> pa.Array:
    """`n` copies of one instant (milliseconds since the epoch) as Spark's timestamp column."""
    return pa.repeat(pa.scalar(ms * 1000, TIMESTAMP_FIELD.type), n)


def declared_columns(schema: StructType, ddl: str, what: str, nullable: Collection[str] = ()) -> tuple[str, ...]:
    """The columns of a declared schema, in its order: any of `ddl`'s columns with their types
    (pruning, as PySpark gives Python sources no other way); anything else is refused with
    the valid columns. `nullable`: columns that may not be declared NOT NULL."""
    valid = dict(col.split() for col in ddl.split(", "))
    problems: list[str] = []
    seen: set[str] = set()
    for f in schema.fields:
        kind = valid.get(f.name)
        if kind is None:
            problems.append(f"unknown column {f.name!r}")
        elif f.dataType.simpleString() != _SPARK_TYPE[kind]:
            problems.append(f"column {f.name!r} of type {f.dataType.simpleString()}, expected {kind}")
        elif f.name in seen:
            problems.append(f"column {f.name!r} twice")
        elif f.name in nullable and not f.nullable:
            problems.append(f"column {f.name!r} is null for some rows: it cannot be NOT NULL")
        seen.add(f.name)
    if not schema.fields:
        problems.append("no column")
    if problems:
        raise SchemaError(f"{what} cannot read the declared schema: {'; '.join(problems)}. Valid columns: {ddl} "
                          f"(any of them, in any order)")
    return tuple(f.name for f in schema.fields)
