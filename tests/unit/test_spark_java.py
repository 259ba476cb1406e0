"""Spark without Java: `dledger audit` says in one line what is missing and what to do,
instead of the launcher's "JAVA_HOME is not set" and PySpark's JAVA_GATEWAY_EXITED."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dledger.spark.java import java_problem

NO_JAVA = ("Spark needs Java 17: no `java` on PATH and JAVA_HOME is not set "
           "(install a JDK 17, e.g. `apt install openjdk-17-jre-headless`)")


def test_no_java_on_path_and_no_java_home(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path)}  # a PATH without java
    assert java_problem(env) == NO_JAVA


def test_java_home_is_what_spark_uses(tmp_path: Path) -> None:
    """As PySpark's launcher: JAVA_HOME, when set, decides (a broken one fails even with
    java on PATH); else `java` on PATH."""
    on_path = tmp_path / "path"
    on_path.mkdir()
    java = on_path / "java"
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    assert java_problem({"PATH": str(on_path)}) is None
    empty_home = tmp_path / "jdk-without-java"
    empty_home.mkdir()
    problem = java_problem({"PATH": str(on_path), "JAVA_HOME": str(empty_home)})
    assert problem is not None and f"JAVA_HOME is {empty_home}, which has no bin/java" in problem
    (empty_home / "bin").mkdir()
    (empty_home / "bin" / "java").symlink_to(java)
    assert java_problem({"PATH": str(tmp_path), "JAVA_HOME": str(empty_home)}) is None


@pytest.mark.skipif(importlib.util.find_spec("pyspark") is None, reason="needs the spark extra")
def test_audit_without_java_fails_in_one_line(tmp_path: Path) -> None:
    """What a pip user without Java sees: the one line, exit 1, before any JVM is started
    (a process of its own: no Spark session of the test run is active in it)."""
    store = tmp_path / "n0"
    (store / "data").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)  # the venv's scripts, no java
    # (--master: a store this small is audited in process, without Spark)
    p = subprocess.run([sys.executable, "-m", "dledger", "audit", "--master", "local[1]", str(store)],
                       capture_output=True, text=True, env=env, timeout=120, check=False)
    assert p.returncode == 1, p
    assert p.stdout == ""
    assert p.stderr.splitlines() == [f"audit failed: {NO_JAVA}"], p.stderr


@pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None, reason="needs the spark extra")
def test_audit_of_small_stores_needs_no_java_and_counts_record_bytes(tmp_path: Path) -> None:
    """Small stores are compared in process (no JVM: here there is no Java at all), and the
    sizes are the records' bytes, not the preallocated data files' (1 GiB each here)."""
    from dledger.store.file import FileLedgerStore

    bodies = [bytes([k]) * (100 + k) for k in range(50)]
    dirs = []
    for name, count in (("n0", 50), ("n1", 50), ("n2", 30)):  # n2 lags: no divergence
        s = FileLedgerStore(tmp_path / name, flush="sync")
        for b in bodies[:count]:
            s.append_as_leader([b], 1)
        s.committed_index = s.end_index
        s.flush()
        s.close()
        dirs.append(str(tmp_path / name))
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)  # no java
    p = subprocess.run([sys.executable, "-m", "dledger", "audit", *dirs, "-o", "json"], capture_output=True,
                       text=True, env=env, timeout=120, check=False)
    assert p.returncode == 0, p
    report = json.loads(p.stdout)
    assert report["ok"] and report["agree_up_to"] == 49, report
    sizes = {m["member"]: (m["records"], m["bytes"], m["file_bytes"]) for m in report["members"]}
    assert sizes == {"n0": (50, sum(48 + len(b) for b in bodies), 1 << 30),
                     "n1": (50, sum(48 + len(b) for b in bodies), 1 << 30),
                     "n2": (30, sum(48 + len(b) for b in bodies[:30]), 1 << 30)}, sizes
    assert "in this process" in p.stderr and "Spark" not in p.stderr, p.stderr
    text = subprocess.run([sys.executable, "-m", "dledger", "audit", *dirs], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert text.returncode == 0 and "n0: indexes 0..49 (50 records, 8.4 KiB)" in text.stdout, text
