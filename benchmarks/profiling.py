"""py-spy around a benchmark run, and a summary of its collapsed stacks (top functions)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

RATE = 100  # samples per second
NATIVE = "(no Python frame: native code holding the GIL)"
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]*)(?::\d+)?\)$")


def py_spy() -> str | None:
    exe = Path(sys.executable).with_name("py-spy")
    return str(exe) if exe.exists() else shutil.which("py-spy")


def record(pid: int, out: Path, duration: float, fmt: str = "raw", subprocesses: bool = False,
           rate: int = RATE, gil: bool = False) -> subprocess.Popen[bytes] | None:
    """Starts `py-spy record` on `pid` for `duration` s (non-blocking sampling: the target is
    not paused); returns the py-spy process, or None when py-spy is missing.

    `gil`: sample only the thread holding the GIL. Python (and C called with the GIL held:
    msgspec, uvloop callbacks, socket sends) shows up; waiting in epoll or fsync does not, so
    samples / (rate x seconds) is the share of time the process's GIL was busy."""
    exe = py_spy()
    if exe is None:
        return None
    cmd = [exe, "record", "--pid", str(pid), "--format", fmt, "-o", str(out), "--duration", str(int(duration)),
           "--rate", str(rate), "--nonblocking"]
    if subprocesses:
        cmd.append("--subprocesses")
    if gil:
        cmd.append("--gil")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def short(path: str) -> str:
    if not path.startswith("/"):
        return path  # py-spy already made it relative to sys.path (dledger/runtime/transport.py)
    for marker in ("site-packages/", "/src/", "/lib/python3.11/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path.rsplit("/", 2)[-1] if "/" in path else path


def frame_key(frame: str) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    return f"{m['func']} ({short(m['file'])})"


@dataclass
class Profile:
    samples: int = 0
    self_: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    files: Counter[str] = field(default_factory=Counter)  # self samples per file (module)

    def top(self, which: str, n: int) -> list[tuple[str, float]]:
        c = self.self_ if which == "self" else self.inclusive if which == "inclusive" else self.files
        return [(k, round(100.0 * v / self.samples, 1)) for k, v in c.most_common(n)] if self.samples else []


def parse_raw(path: Path) -> Profile:
    """Collapsed stacks (`frame;frame;... count`): self = the innermost frame, inclusive = any
    frame of the stack (counted once per stack)."""
    p = Profile()
    if not path.exists():
        return p
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        if stack.startswith("process "):
            # --subprocesses: `process PID:"command line";frames`, and a command line may hold `;`
            first = next((i for i, f in enumerate(parts) if _FRAME.match(f)), len(parts))
            parts = parts[first:] or [NATIVE]
        n = int(count)
        frames = [f for f in parts if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        p.samples += n
        keys = [frame_key(f) for f in frames]
        p.self_[keys[-1]] += n
        m = _FRAME.match(frames[-1])
        p.files[short(m["file"]) if m else "?"] += n
        for key in set(keys):
            p.inclusive[key] += n
    return p
