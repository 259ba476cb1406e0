"""`dledger`'s public names load on first use (PEP 562): a command or a member start pays only
for what it imports, and a member that serves no bulk reader never loads numpy."""

from __future__ import annotations

import subprocess
import sys

import dledger


def test_every_public_name_resolves() -> None:
    for name in dledger.__all__:
        assert getattr(dledger, name).__name__ == name


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        dledger.NoSuchName  # noqa: B018
    except AttributeError as e:
        assert "NoSuchName" in str(e)
    else:
        raise AssertionError("an unknown name resolved")


def test_importing_the_package_or_a_member_loads_no_more_than_it_needs() -> None:
    code = ("import sys, dledger; a = {m for m in ('dledger.runtime.server', 'dledger.broker.client', 'numpy') "
            "if m in sys.modules}; import dledger.cli, dledger.runtime.server; "
            "print(sorted(a), 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]", "False"], out
