"""Every shell and Python example of README.md and docs/ is run or checked by this test, so
none can rot. A block says which, in a comment above its fence:

- `<!-- run -->`: run as written, in page order, against what the page itself starts (its
  ports 20911… moved to free ones, side by side). Bash blocks run with `bash -e`; a page's
  Python blocks share one interpreter, as a notebook's cells do.
- `<!-- run: cluster ARGS -->`: as run, against a 3-member group this test starts first
  (`dledger server` ARGS, e.g. `--state-machine kv`).
- `<!-- check: WHY -->`: not run (it installs packages, runs a benchmark for minutes, or
  starts a server in the foreground): every `dledger`, `make` and `python benchmarks/…`
  command in it must name a real command and only options it has; Python must compile and
  its `dledger` imports exist.

DLEDGER_PEERS names the group of `run: cluster`. A page that runs Spark is marked `spark`."""

from __future__ import annotations

import ast
import importlib
import os
import re
import select
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from dledger.local_cluster import local_cluster
from dledger.ports import free_port_run

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"(?:<!-- (run|check)(?::([^>]*))? -->\n[ \t]*)?```(\w*)\n(.*?)```", re.S)
_COMMAND = re.compile(r"^\s*(\$ )?(dledger|python|\.venv/bin/|pip|make|pytest|pkill)\b", re.M)
_PORT_SPAN = 40  # 20911..20950: a page's groups, controllers and brokers keep their offsets
_SPARK_ENV = {"PYSPARK_SUBMIT_ARGS": "--master local[2] --conf spark.ui.enabled=false "
                                     "--conf spark.sql.shuffle.partitions=2 pyspark-shell",
              "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


@dataclass
class Block:
    page: Path
    marker: str  # "run", "check" or "" (neither)
    arg: str
    lang: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.name} ({self.lang or 'plain'} block starting {self.code.strip().splitlines()[0][:60]!r})"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    return [Block(page, m or "", (a or "").strip(), lang, code) for m, a, lang, code in _FENCE.findall(text)]


def all_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _is_example(b: Block) -> bool:
    runnable = b.lang in ("bash", "sh", "shell", "console", "python", "sql")
    return runnable or (b.lang == "" and bool(_COMMAND.search(b.code)))


def test_every_example_is_run_or_checked() -> None:
    unmarked = [b.name for p in all_pages() for b in blocks(p) if _is_example(b) and not b.marker]
    assert not unmarked, "examples neither run nor checked (mark them <!-- run --> or <!-- check: why -->):\n" + \
        "\n".join(unmarked)
    assert {"getting-started.md", "README.md", "spark.md", "state-machines.md"} <= {p.name for p in run_pages()}


def run_pages() -> list[Path]:
    return [p for p in all_pages() if any(b.marker == "run" for b in blocks(p))]


def _page_param(page: Path) -> object:
    spark = any(b.marker == "run" and ("register(spark)" in b.code or "dledger audit" in b.code) for b in blocks(page))
    return pytest.param(page, id=page.name, marks=[pytest.mark.spark] if spark else [])


class Notebook:
    """One Python interpreter for a page's blocks: each block runs in the same namespace."""

    _DRIVER = ("import sys, traceback\nns = {'__name__': '__main__'}\n"
               "while (n := sys.stdin.readline()):\n"
               "    code = sys.stdin.read(int(n)); ok = True\n"
               "    try:\n        exec(compile(code, '<example>', 'exec'), ns)\n"
               "    except BaseException:\n        traceback.print_exc(); ok = False\n"
               "    sys.stderr.flush(); print('\\n@@done', ok, flush=True)\n")

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-u", "-c", self._DRIVER], cwd=cwd, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def run(self, code: str, timeout: float = 300) -> tuple[bool, str]:
        """Its output until the driver's end line (read from the pipe's fd: no buffer hides it)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{len(code)}\n{code}")
        self.proc.stdin.flush()
        fd, out = self.proc.stdout.fileno(), b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 1.0)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return False, out.decode(errors="replace") + "\n(the interpreter exited)"
                out += chunk
                if (m := re.search(rb"\n@@done (True|False)\n", out)) is not None:
                    return m.group(1) == b"True", out[:m.start()].decode(errors="replace")
        return False, out.decode(errors="replace") + f"\n(no end after {timeout} s)"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _kill_under(cwd: Path) -> None:
    """Every process a page left running (its members, a background cluster): all run in cwd."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")).is_relative_to(cwd):
                os.kill(int(proc.name), 9)
        except (OSError, ValueError):
            continue


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", [_page_param(p) for p in run_pages()])
def test_examples_run_as_written(page: Path, tmp_path: Path) -> None:
    base = free_port_run(_PORT_SPAN)

    def moved(code: str) -> str:
        return re.sub(r"\b209(\d\d)\b", lambda m: str(base + int(m.group(1)) - 11), code)

    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               DLEDGER_PEERS=";".join(f"n{k}-127.0.0.1:{base + k}" for k in range(3)), **_SPARK_ENV)
    env.pop("DLEDGER_GROUP", None)
    work = tmp_path / "work"
    work.mkdir()
    cluster: local_cluster | None = None
    notebook = Notebook(work, env)
    try:
        for k, b in enumerate(blocks(page)):
            if b.marker != "run":
                continue
            if b.arg.startswith("cluster") and cluster is None:
                cluster = local_cluster(env["DLEDGER_PEERS"], "default", tmp_path / "cluster", "async", "file",
                                        extra=b.arg.removeprefix("cluster").split())
                cluster.__enter__()
            if b.lang == "bash":
                ok, out = _run_bash(moved(b.code), work, env)
            else:
                ok, out = notebook.run(moved(b.code) if b.lang == "python" else _sql_cell(moved(b.code)))
            assert ok, f"{page.name} block {k + 1} ({b.lang}) failed:\n{b.code}\n--- output\n{out[-3000:]}"
    finally:
        notebook.close()
        if cluster is not None:
            cluster.__exit__(None, None, None)
        _kill_under(work)


def _run_bash(code: str, cwd: Path, env: dict[str, str]) -> tuple[bool, str]:
    """A file, not a pipe, takes the output: a block may leave a process running behind it."""
    log = cwd.parent / "block.log"
    with log.open("w") as out:
        p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=cwd, env=env, stdout=out,
                           stderr=subprocess.STDOUT, timeout=300, check=False)
    return p.returncode == 0, log.read_text(errors="replace")


def _sql_cell(sql: str) -> str:
    """Python running a SQL block's statements, one by one, on the page's `spark`."""
    statements = [q.strip() for q in re.split(r";[ \t]*(?:\n|$)", re.sub(r"--[^\n]*", "", sql)) if q.strip()]
    return f"for _q in {statements!r}:\n    spark.sql(_q).show()\n"


# --- checked, not run ----------------------------------------------------------------------------

def _commands(code: str) -> list[list[str]]:
    """The simple commands of a shell block (continuations joined, split at ; | && & ( ))."""
    words = shlex.shlex(code.replace("\\\n", " "), posix=True, punctuation_chars=";|&()\n")
    words.whitespace = " \t"
    words.commenters = "#"
    out: list[list[str]] = [[]]
    for w in words:
        if w and set(w) <= set(";|&()\n"):
            out.append([])
        else:
            out[-1].append(w)
    return [c for c in out if c]


def _cli_problems(args: list[str]) -> list[str]:
    from dledger.cli import cli

    cmd: click.Command = cli
    ctx = click.Context(cli)
    path = ["dledger"]
    while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
        sub = cmd.get_command(ctx, args[0])
        if sub is None:
            return [f"{' '.join(path)} has no command {args[0]!r}"]
        path.append(args[0])
        cmd, args = sub, args[1:]
    known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    flags = {a.strip("[]").split("=")[0] for a in args if a.strip("[]").startswith("-") and a.strip("[]") != "-"}
    return [f"{' '.join(path)} has no option {f}" for f in sorted(flags - known)]


def _script_problems(argv: list[str], args: list[str]) -> list[str]:
    if argv[0].endswith(".py") and not (ROOT / argv[0]).exists():
        return [f"no script {argv[0]}"]
    p = subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       check=False)
    # a script whose imports are not installed here (pysyncobj): its source names its options
    helptext = p.stdout if p.returncode == 0 else (ROOT / argv[0]).read_text()
    flags = {a.strip("[]").split("=")[0] for a in args if a.startswith("--")}
    return [f"{' '.join(argv)} has no option {f}" for f in sorted(flags) if f not in helptext]


def _command_problems(words: list[str]) -> list[str]:
    words = words[1:] if words[0] == "$" else words
    prog = Path(words[0]).name
    if prog == "dledger":
        return _cli_problems(words[1:])
    if prog.startswith("python") and len(words) > 1 and words[1].endswith(".py"):
        return _script_problems([words[1]], words[2:])
    if prog.startswith("python") and words[1:3] == ["-m", "dledger"]:
        return _cli_problems(words[3:])
    if prog.startswith("python") and words[1:2] == ["-m"] and words[2].startswith("dledger"):
        return _script_problems(words[1:3], words[3:])
    if prog == "make":
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
        return [f"no make target {t}" for t in words[1:] if not t.startswith("-") and t not in targets]
    return []


def _python_problems(code: str) -> list[str]:
    tree = ast.parse(code)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "dledger":
            mod = importlib.import_module(node.module)
            problems += [f"{node.module} has no {a.name}" for a in node.names if not hasattr(mod, a.name)]
    return problems


def checked_blocks() -> list[Block]:
    return [b for p in all_pages() for b in blocks(p) if b.marker == "check"]


@pytest.mark.parametrize("block", checked_blocks(), ids=lambda b: b.name)
def test_checked_examples_name_real_commands_and_options(block: Block) -> None:
    assert block.arg, f"say why it is not run: <!-- check: why --> ({block.name})"
    if block.lang == "python":
        problems = _python_problems(block.code)
    else:
        problems = [p for words in _commands(block.code) for p in _command_problems(words)]
    assert not problems, f"{block.name}:\n" + "\n".join(problems)
