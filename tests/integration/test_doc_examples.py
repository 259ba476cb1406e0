"""The examples of README.md and docs/ marked `<!-- run -->` run as written, in page order,
against the local group the page itself starts (ports 20911… moved to free ones), so a
newcomer's first commands cannot rot; `<!-- run: cluster ARGS -->` runs a block against a
3-member group this test starts first (`dledger server` ARGS, e.g. `--state-machine kv`).
Bash blocks run with `bash -e`, Python blocks with this interpreter; DLEDGER_PEERS names
the group's members."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dledger.local_cluster import local_cluster
from dledger.ports import free_port_run

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"<!-- run(: cluster[^>]*)? -->\n```(bash|python)\n(.*?)```", re.S)


def pages() -> list[Path]:
    return [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if _BLOCK.search(p.read_text())]


def test_some_pages_have_runnable_examples() -> None:
    assert {ROOT / "docs" / "getting-started.md", ROOT / "README.md", ROOT / "docs" / "format.md"} <= set(pages())


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_examples_run_as_written(page: Path, tmp_path: Path) -> None:
    base = free_port_run(3)
    ports = {str(20911 + k): str(base + k) for k in range(3)}  # the group's, side by side
    for other in sorted(set(re.findall(r"\b209\d\d\b", page.read_text())) - set(ports)):
        ports[other] = str(free_port_run(1))  # an example's own member

    def moved(code: str) -> str:
        return re.sub(r"\b209\d\d\b", lambda m: ports[m.group(0)], code)

    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               DLEDGER_PEERS=";".join(f"n{k}-127.0.0.1:{base + k}" for k in range(3)))
    env.pop("DLEDGER_GROUP", None)
    cluster: local_cluster | None = None
    try:
        for k, (cluster_args, lang, code) in enumerate(_BLOCK.findall(page.read_text())):
            if cluster_args and cluster is None:  # ": cluster ARGS"
                cluster = local_cluster(env["DLEDGER_PEERS"], "default", tmp_path / "cluster", "async", "file",
                                        extra=cluster_args.removeprefix(": cluster").split())
                cluster.__enter__()
            cmd = ["bash", "-e", "-o", "pipefail", "-c", moved(code)] if lang == "bash" else [sys.executable, "-c",
                                                                                              moved(code)]
            p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=180, check=False)
            assert p.returncode == 0, (f"{page.name} block {k + 1} ({lang}) failed with {p.returncode}:\n{code}\n"
                                       f"--- stdout\n{p.stdout.decode(errors='replace')[-2000:]}\n"
                                       f"--- stderr\n{p.stderr.decode(errors='replace')[-2000:]}")
    finally:
        if cluster is not None:
            cluster.__exit__(None, None, None)
        subprocess.run(["pkill", "-f", "--", f"--base-port {base}"], check=False)
        subprocess.run(["pkill", "-9", "-f", "--", f"n0-127.0.0.1:{base};"], check=False)
