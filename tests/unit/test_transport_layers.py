"""The transport's parts stand on their own (docs/architecture.md): what each module may import.

Read from the source (the package's __init__ imports much, so sys.modules would tell nothing).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "dledger"


def imports(relative: str) -> set[str]:
    tree = ast.parse((SRC / relative).read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


@pytest.mark.parametrize(("module", "forbidden"), [
    # no project module at all: everything that reads an address stands above it
    ("address.py", ("dledger",)),
    # sans-I/O: fed bytes in tests, no socket, no event loop
    ("runtime/frames.py", ("asyncio", "socket", "ssl", "dledger.runtime.", "dledger.security")),
    ("runtime/faults.py", ("asyncio", "dledger")),
    # either end's connection knows neither end
    ("runtime/connection.py", ("dledger.runtime.transport", "dledger.runtime.faults", "dledger.security")),
    ("runtime/transport_server.py", ("dledger.runtime.transport_client", "dledger.runtime.faults")),
    ("runtime/transport_client.py", ("dledger.runtime.transport_server",)),
])
def test_what_a_part_does_not_import(module: str, forbidden: tuple[str, ...]) -> None:
    bad = sorted(m for m in imports(module) if m.startswith(forbidden))
    assert not bad, f"{module} imports {bad}"


def test_the_facade_only_gathers() -> None:
    """runtime/transport.py defines nothing: it re-exports the parts' public names."""
    tree = ast.parse((SRC / "runtime" / "transport.py").read_text())
    defined = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    assert not defined
