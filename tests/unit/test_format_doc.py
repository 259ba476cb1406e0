"""docs/format.md's lists of request and response codes name every code with its number, as
the code has them: users write clients from that page."""

from __future__ import annotations

import re
from pathlib import Path

from dledger.codes import RequestCode, ResponseCode

PAGE = Path(__file__).resolve().parents[2] / "docs" / "format.md"


def _named_numbers(heading: str) -> dict[str, int]:
    text = PAGE.read_text()
    start = text.index(heading)
    para = text[start:text.index("\n\n", start)].replace("\u2212", "-")
    return {name: int(num) for name, num in re.findall(r"\b([A-Z][A-Z_]+) (-?\d+)\b", para)}


def test_response_codes_match_the_code() -> None:
    assert _named_numbers("**Response codes**") == {c.name: int(c) for c in ResponseCode}


def test_request_codes_match_the_code() -> None:
    assert _named_numbers("**Request codes**") == {c.name: int(c) for c in RequestCode}
