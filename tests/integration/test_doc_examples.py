"""Every shell and Python example of README.md and docs/ is run or checked by this test, so
none can rot. A block says which, in a comment above its fence:

- `<!-- run -->`: run as written, in page order, against what the page itself starts (its
  ports 20911… moved to free ones, side by side). Bash blocks run with `bash -e`; a page's
  Python blocks share one interpreter, as a notebook's cells do.
- `<!-- run: cluster ARGS -->`: as run, against a 3-member group this test starts first
  (`dledger server` ARGS, e.g. `--state-machine kv`), as `dledger cluster --data-dir ./data`
  runs it: mutual TLS, its certificates in `data/certs` (those the page made there, or new
  ones), so the page's Python passes `tls=TlsConfig.from_dir("data/certs")`; ARGS
  `--insecure`: no TLS.
- `<!-- check: WHY -->`: not run (it installs packages, runs a benchmark for minutes, or
  starts a server in the foreground): every `dledger`, `make` and `python benchmarks/…`
  command in it must name a real command and only options it has; Python must compile and
  its `dledger` imports exist.

DLEDGER_PEERS (and, with TLS, DLEDGER_TLS_DIR) name the group of `run: cluster`. A page that
runs Spark is marked `spark`."""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.util
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from dledger.local_cluster import local_certs, local_cluster
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


class Session:
    """A process a page's blocks run in one after another, as in one terminal: each block's
    output is read up to the end line it prints (from the pipe's fd: no buffer hides it)."""

    proc: subprocess.Popen[bytes]
    token = uuid.uuid4().hex  # the end line's: an example cannot print it by chance

    def send(self, text: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def output(self, timeout: float = 300) -> tuple[bool, str]:
        assert self.proc.stdout is not None
        fd, out = self.proc.stdout.fileno(), b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 1.0)[0]:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return False, out.decode(errors="replace") + "\n(it exited: a command failed)"
                out += chunk
                if (m := re.search(rb"\n@@done-%s (True|False)\n" % self.token.encode(), out)) is not None:
                    return m.group(1) == b"True", out[:m.start()].decode(errors="replace")
        return False, out.decode(errors="replace") + f"\n(no end after {timeout} s)"

    def close(self) -> None:
        """It and whatever it started (its own session: background jobs too)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class Notebook(Session):
    """One Python interpreter for a page's blocks: each block runs in the same namespace, with
    the environment the page's shell has exported by then."""

    _DRIVER = ("import os, sys, json, traceback\nns = {'__name__': '__main__'}\n"
               "while (n := sys.stdin.buffer.readline()):\n"
               "    cell = json.loads(sys.stdin.buffer.read(int(n))); ok = True\n"
               "    os.environ.clear(); os.environ.update(cell['env']); os.chdir(cell['env'].get('PWD', '.'))\n"
               "    try:\n        exec(compile(cell['code'], '<example>', 'exec'), ns)\n"
               "    except BaseException:\n        traceback.print_exc(); ok = False\n"
               # one write (atomic on a pipe): Spark's JVM shares the pipe and may write between
               # the pieces print() would send apart
               "    sys.stderr.flush(); sys.stdout.write(f'\\n@@done-{sys.argv[1]} {ok}\\n'); sys.stdout.flush()\n")

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-u", "-c", self._DRIVER, self.token], cwd=cwd, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def run(self, code: str, env: dict[str, str]) -> tuple[bool, str]:
        cell = json.dumps({"code": code, "env": env}).encode()
        self.send(b"%d\n%s" % (len(cell), cell))
        return self.output()


class Shell(Session):
    """One bash (`set -e -o pipefail`) for a page's blocks: a variable set, a directory changed
    or a job started in one block is there in the next, as in a reader's terminal; a failing
    command ends the shell, and the block with it. Each block is sourced from a file, stdin
    /dev/null, so a command that reads stdin cannot eat the next block."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.dir = cwd.parent
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile"], cwd=cwd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        self.send(b"set -e -o pipefail\n")
        self.blocks = 0

    def run(self, code: str) -> tuple[bool, str]:
        self.blocks += 1
        script = self.dir / f"block{self.blocks}.sh"
        script.write_text(code)
        self.send(f"source {script} < /dev/null\nprintf '\\n@@done-{self.token} True\\n'\n".encode())
        return self.output()

    def env(self) -> dict[str, str]:
        """What the shell exports now (for the page's next Python block)."""
        dump = self.dir / "env"
        ok, out = self.run(f"env -0 > {dump}")
        assert ok, out
        return dict(item.split("=", 1) for item in dump.read_text().split("\0") if "=" in item)


# what a shell example must never print, whatever its exit status (`|| true` hides no traceback)
_BROKEN = re.compile(r"Traceback \(most recent call last\)|dledger: internal error|dledger: error:")


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
               **_SPARK_ENV)
    for name in ("DLEDGER_PEERS", "DLEDGER_GROUP", "DLEDGER_TLS_DIR", "DLEDGER_AUTH_TOKEN", "DLEDGER_CLIENT_TOKEN",
                 "DLEDGER_ADMIN_TOKEN"):  # a reader's shell has only what the page exports
        env.pop(name, None)
    work = tmp_path / "work"
    work.mkdir()
    cluster: local_cluster | None = None
    shell, notebook = Shell(work, env), Notebook(work, env)
    try:
        for k, b in enumerate(blocks(page)):
            if b.marker != "run":
                continue
            if b.arg.startswith("cluster") and cluster is None:  # the group the page says it needs
                peers = ";".join(f"n{i}-127.0.0.1:{base + i}" for i in range(3))
                extra = b.arg.removeprefix("cluster").split()
                # as `dledger cluster --data-dir ./data` runs it: mutual TLS unless --insecure
                tls_dir = None if "--insecure" in extra else \
                    local_certs(work / "data" / "certs", members=[f"n{i}" for i in range(3)])
                cluster = local_cluster(peers, "default", tmp_path / "cluster", "async", "file", extra=extra,
                                        tls_dir=tls_dir)
                cluster.__enter__()
                exports = f"export DLEDGER_PEERS='{peers}'" + (f" DLEDGER_TLS_DIR='{tls_dir}'" if tls_dir else "")
                assert shell.run(exports)[0]
            if b.lang == "bash":
                ok, out = shell.run(moved(b.code))
            else:
                code = moved(b.code) if b.lang == "python" else _sql_cell(moved(b.code))
                ok, out = notebook.run(code, shell.env())
            # a shell block must not print a failure it survived; a Python block's own exception
            # fails it (PySpark's daemon prints tracebacks of workers cut short by a limit: noise)
            assert ok and not (b.lang == "bash" and _BROKEN.search(out)), \
                f"{page.name} block {k + 1} ({b.lang}) failed:\n{b.code}\n--- output\n{out[-3000:]}"
    finally:
        shell.close()
        notebook.close()
        if cluster is not None:
            cluster.__exit__(None, None, None)
        _kill_under(work)


def _sql_cell(sql: str) -> str:
    """Python running a SQL block's statements, one by one, on the page's `spark`."""
    statements = [q.strip() for q in re.split(r";[ \t]*(?:\n|$)", re.sub(r"--[^\n]*", "", sql)) if q.strip()]
    return f"for _q in {statements!r}:\n    spark.sql(_q).show()\n"


# --- checked, not run ----------------------------------------------------------------------------

def _commands(code: str) -> list[list[str]]:
    """The simple commands of a shell block: continuations joined, each line lexed on its own (a
    comment ends at its line), split at ; | && & ( ), and wrappers taken off (`FOO=1 timeout 5
    dledger …`, `if dledger …`, `xargs dledger …` are dledger commands)."""
    out: list[list[str]] = []
    pending = ""
    for line in code.replace("\\\n", " ").splitlines():
        pending += line
        lex = shlex.shlex(pending, posix=True, punctuation_chars=";|&()")
        lex.whitespace_split, lex.commenters = True, "#"
        try:
            words = list(lex)
        except ValueError:  # a quote open across lines (an awk program): read on
            pending += "\n"
            continue
        pending = ""
        command: list[str] = []
        for w in words:
            if set(w) <= set(";|&()"):
                out.append(command)
                command = []
            else:
                command.append(w)
        out.append(command)
    return [c for c in map(_unwrapped, out) if c]


_WRAPPERS = {"if", "then", "else", "do", "while", "until", "!", "time", "nohup", "sudo", "exec", "env", "xargs"}


def _unwrapped(words: list[str]) -> list[str]:
    while words:
        if words[0] == "$" or words[0] in _WRAPPERS or re.fullmatch(r"\w+=.*", words[0]) or words[0].startswith("-"):
            words = words[1:]  # a prompt, a wrapper, an assignment, a wrapper's option
        elif words[0] == "timeout":  # timeout [-s SIG] DURATION COMMAND
            words = words[1:]
            while words and (words[0].startswith("-") or re.fullmatch(r"[A-Z]+|\d+[smhd]?", words[0])):
                words = words[1:]
        else:
            return words
    return words


def _is_option(word: str) -> bool:
    """An option word, also inside a synopsis's brackets (`[--flush sync]`); `-` is stdin."""
    return word.lstrip("[").startswith("-") and word != "-"


def _option_problems(cmd: click.Command, args: list[str], path: list[str]) -> tuple[list[str], list[str]]:
    """Problems with the options at the front of `args` (up to the first word that is not an
    option or an option's value, or `--`), and the rest; a Choice's literal value must be one
    of them."""
    by_name = {o: p for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}
    by_name["--help"] = by_name["-h"] = click.Option(["--help", "-h"], is_flag=True)
    problems: list[str] = []
    while args and _is_option(args[0]) and args[0] != "--":
        word, args = args[0].strip("[]"), args[1:]
        name, _, value = word.partition("=")
        names = [f"-{c}" for c in name[1:]] if not name.startswith("--") else [name]  # -vv: -v -v
        attached = by_name.get(names[0]) if len(names) > 1 else None
        if attached is not None and not (attached.is_flag or attached.count):  # -ojson, -n5
            names, value = names[:1], name[2:]
        for n in names:
            opt = by_name.get(n)
            if opt is None:
                problems.append(f"{' '.join(path)} has no option {n}")
                continue
            if not (opt.is_flag or opt.count) and not value and len(names) == 1:
                value, args = (args[0].strip("[]"), args[1:]) if args else ("", args)
            literal = value and re.fullmatch(r"[a-z][\w.-]*", value)
            if isinstance(opt.type, click.Choice) and literal and value not in opt.type.choices:
                problems.append(f"{' '.join(path)} {n}: {value!r} is none of {list(opt.type.choices)}")
            value = ""
    return problems, args


def _cli_problems(args: list[str]) -> list[str]:
    """Each subcommand exists, each option is one its command has (the group's own options before
    its subcommand included), a Choice's value is allowed; placeholders (`$P`, `DIR`, `...`)
    pass, as a reader would replace them."""
    from dledger.cli import cli

    cmd: click.Command = cli
    path, problems = ["dledger"], []
    while True:
        found, args = _option_problems(cmd, args, path)
        problems += found
        if not (isinstance(cmd, click.Group) and args) or args[0] in ("...", "…", "--"):  # `dledger …`: any
            break
        sub = cmd.get_command(click.Context(cmd), args[0])
        if sub is None:
            return [*problems, f"{' '.join(path)} has no command {args[0]!r}"]
        path.append(args[0])
        cmd, args = sub, args[1:]
    while args and args[0] != "--":  # options after the arguments (after `--`: arguments only)
        skip = next((k for k, a in enumerate(args) if _is_option(a)), len(args))
        found, args = _option_problems(cmd, args[skip:], path)
        problems += found
    return problems


@functools.cache
def _help_text(argv: tuple[str, ...]) -> str:
    """`argv --help`, run once per worker (several blocks name the same script)."""
    p = subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       check=False)
    # a script whose imports are not installed here (pysyncobj): its source names its options
    return p.stdout if p.returncode == 0 else (ROOT / argv[0]).read_text()


def _script_problems(argv: list[str], args: list[str]) -> list[str]:
    if argv[0].endswith(".py") and not (ROOT / argv[0]).exists():
        return [f"no script {argv[0]}"]
    known = set(re.findall(r"--[\w-]+", _help_text(tuple(argv)))) | {"--help"}
    flags = {a.strip("[]").split("=")[0] for a in args if a.strip("[]").startswith("--")}
    return [f"{' '.join(argv)} has no option {f}" for f in sorted(flags - known)]


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
        return [f"no make target {t}" for t in words[1:] if not t.startswith("-") and "=" not in t
                and t not in targets]
    return []


def _python_problems(code: str) -> list[str]:
    """It compiles, and what it imports from dledger exists."""
    problems = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "dledger"]
            problems += [f"no module {n}" for n in names if importlib.util.find_spec(n) is None]
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


def test_commands_in_the_text_name_real_commands_and_options() -> None:
    """`dledger …` written inline in a page's prose or tables: the same check as a checked block."""
    problems, spans = [], 0
    for page in all_pages():
        prose = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for span in re.findall(r"`((?:dledger|make) [^`]+)`", prose):
            spans += 1
            problems += [f"{page.name}: `{span}`: {p}" for p in _command_problems(shlex.split(span))]
    assert spans > 50 and not problems, "\n".join(problems)
