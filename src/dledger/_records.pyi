"""Types of the optional C extension (src/dledger/_records.c); see dledger.entry."""

from collections.abc import Sequence

VERSION: int

def encode_run(
    bodies: Sequence[bytes], start: int, stop: int, index: int, term: int, pos: int, prev_chain: int, magic: int, /
) -> tuple[bytes, bytes, bytes, int]: ...
def scan_run(
    buf: object,
    start: int,
    end: int,
    index: int,
    pos: int,
    prev_chain: int,
    term_floor: int,
    units: bytearray | None,
    max_count: int,
    /,
) -> tuple[int, int, int, int]: ...
def check_columns(
    data: object,
    first: int,
    units: bytes,
    term: int,
    pos: int,
    magic: int,
    chain: int,
    body_crc: int,
    magic_mask: int,
    bodies: bool,
    budget: int,
    take_one: bool,
    /,
) -> tuple[bytes, bytes, bytes, bytes, bytes, int, int, bool] | None: ...
def body_ends(sizes: object, /) -> bytes: ...
def scan_entries(
    buf: object,
    start: int,
    size: int,
    index: int,
    pos: int,
    chain: int,
    term_floor: int,
    last_index: int,
    end_pos: int,
    emit_from: int,
    term_lo: int,
    term_hi: int,
    bodies: bool,
    verify_bodies: bool,
    max_rows: int,
    max_bytes: int,
    /,
) -> tuple[int, int, int, int, int, int, bytes, bytes, bytes, bytes, bytes]: ...
