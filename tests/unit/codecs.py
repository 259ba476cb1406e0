"""Both record-codec loops under one test: the C one (dledger._records, where built) and the
pure-Python fallback dledger.entry keeps. A test module opts in with

    codec = pytest.fixture(scope="module", autouse=True, params=CODECS)(use_codec)

and then runs once per loop (ids "c" and "python")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dledger import entry

CODECS = ["c", "python"]


def use_codec(request: pytest.FixtureRequest) -> Iterator[str]:
    """Point dledger.entry at one loop for the module's tests, then put it back."""
    saved = entry.native
    if request.param == "c":
        if saved is None:
            pytest.fail("the C extension dledger._records is not built (pip install -e . compiles it; "
                        "DLEDGER_PURE_PYTHON=1 turns it off)")
    else:
        entry.native = None
    try:
        yield request.param
    finally:
        entry.native = saved
