"""One chaos run: start a group, run the workload under the nemesis, heal, let the
group converge, collect the final logs (client and store files) and check.

Run directory layout (`--dir`): `stores/nK` (member stores), `logs/nK.log` (member
output), `history.jsonl`, `final.json` (final logs, for replaying the checker),
`summary.json`.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dledger.chaos.checker import CheckResult, FinalState, LogEntry, MemberLog, check, format_summary
from dledger.chaos.harness import Harness
from dledger.chaos.nemesis import Nemesis
from dledger.chaos.workload import History, Workload
from dledger.codes import DLedgerError
from dledger.runtime.client import AsyncDLedgerClient

log = logging.getLogger(__name__)


@dataclass
class RunConfig:
    seed: int
    duration: float = 30.0
    nodes: int = 3
    flush: str = "async"
    dir: Path = Path("chaos-run")
    history: Path | None = None
    clients: int = 4
    availability_bound_s: float = 20.0
    converge_bound_s: float = 60.0
    faults: tuple[str, ...] | None = None

    def replay_command(self) -> str:
        return (f"python -m dledger.chaos --seed {self.seed} --duration {self.duration:g} --nodes {self.nodes} "
                f"--flush {self.flush} --dir {self.dir}")


@dataclass
class RunReport:
    config: RunConfig
    result: CheckResult
    summary: str

    @property
    def ok(self) -> bool:
        return self.result.ok


class RunError(Exception):
    """The run could not be carried out (not a verdict on the system under test)."""


def run(cfg: RunConfig) -> RunReport:
    """Carry out one run; the processes it started are gone when it returns or raises."""
    base = Path(cfg.dir)
    base.mkdir(parents=True, exist_ok=True)
    for sub in ("stores", "logs"):  # our own layout: a leftover store would change the run
        shutil.rmtree(base / sub, ignore_errors=True)
    history = History(cfg.history or base / "history.jsonl")
    harness: Harness | None = None
    workload: Workload | None = None
    try:
        harness = Harness(cfg.nodes, base, flush=cfg.flush, on_event=history.event)
        history.add({"kind": "run", "client": "harness", "time": history.now(),
                     "config": {"seed": cfg.seed, "duration": cfg.duration, "nodes": cfg.nodes, "flush": cfg.flush,
                                "peers": harness.client_peers}})
        harness.start_all()
        if harness.wait_leader(60.0) is None:
            raise RunError(f"no leader within 60 s of starting the group; see {base / 'logs'}")
        workload = Workload(harness.client_peers, harness.group, harness.ids, history, cfg.seed, cfg.clients)
        workload.start()
        nemesis = Nemesis(harness, cfg.seed, history.add, history.now, kinds=cfg.faults)
        nemesis.run(cfg.duration)
        healed = [r["time"] for r in history.records if r.get("fault") == "heal-all"][-1]
        _wait_for_ack(workload, history, healed, cfg.availability_bound_s)
        workload.stop()
        workload = None
        final = _final_state(harness, cfg.converge_bound_s)
        harness.check_crashes()
        harness.stop_all()
        final.stores = {m: dump_store(harness.members[m].store_dir, m) for m in harness.ids}
    finally:
        if workload is not None:
            workload.stop()
        if harness is not None:
            harness.close()
        history.close()
    (base / "final.json").write_text(json.dumps(final.to_json()))
    result = check(history.records, final, cfg.availability_bound_s)
    title = f"chaos seed={cfg.seed} nodes={cfg.nodes} flush={cfg.flush} duration={cfg.duration:g}s"
    summary = format_summary(result, title)
    if not result.ok:
        summary += (f"\n  FAILED; replay with: {cfg.replay_command()}"
                    f"\n  history: {cfg.history or base / 'history.jsonl'}")
    (base / "summary.json").write_text(json.dumps({
        "seed": cfg.seed, "nodes": cfg.nodes, "flush": cfg.flush, "duration": cfg.duration,
        "stats": result.stats, "violations": [str(v) for v in result.violations], "suppressed": result.suppressed,
    }, indent=1))
    return RunReport(cfg, result, summary)


def _wait_for_ack(workload: Workload, history: History, healed: float, bound: float) -> None:
    """Keep the workload going until an append is acknowledged after the heal (or the
    bound passes: the checker then reports the group unavailable), then a little more."""
    while history.now() < healed + bound and workload.last_ok_append < healed:
        time.sleep(0.1)
    time.sleep(1.0)


def _final_state(harness: Harness, bound: float) -> FinalState:
    """Wait until the members converge, then read each member's committed log through the client."""
    final = FinalState(converge_bound_s=bound)
    deadline = time.monotonic() + bound
    ok, seen = harness.caught_up()
    while not ok and time.monotonic() < deadline:
        time.sleep(0.3)
        harness.check_crashes()
        ok, seen = harness.caught_up()
    final.converged = ok
    final.convergence = {"members": {m: list(v) if v else None for m, v in seen.items()}}
    for m in harness.ids:
        final.client_views[m] = _client_view(harness, m)
    return final


def _client_view(harness: Harness, member: str) -> MemberLog:
    async def read_all() -> MemberLog:
        async with AsyncDLedgerClient(harness.client_peers, harness.group, timeout=10.0, request_timeout=5.0) as c:
            meta = await c.metadata(member)
            view = MemberLog(member, "client", meta.committed_index, meta.ledger_begin_index, meta.ledger_end_index)
            nxt = meta.ledger_begin_index
            while True:
                batch = await c.read(nxt, 1000, member=member)
                for e in batch:
                    body = e.body.decode("utf-8", "backslashreplace")
                    view.entries[e.index] = LogEntry(e.index, e.term, e.magic, body)
                if not batch:
                    return view
                nxt = batch[-1].index + 1

    try:
        return harness.ctl.run(read_all(), timeout=120)
    except (DLedgerError, TimeoutError) as e:
        return MemberLog(member, "client", -1, error=str(e))


def dump_store(store_dir: Path, member: str) -> MemberLog:
    """Every entry of a stopped member's store, with its chain CRC (opened offline)."""
    from dledger.store.file import FileLedgerStore

    try:
        store = FileLedgerStore(store_dir)
    except Exception as e:  # DISK_ERROR and friends: reported as a violation
        return MemberLog(member, "store", -1, error=f"{type(e).__name__}: {e}")
    try:
        out = MemberLog(member, "store", store.committed_index, store.begin_index, store.end_index)
        for i in range(store.begin_index, store.end_index + 1):
            ent = store.get(i)
            out.entries[i] = LogEntry(ent.index, ent.term, ent.magic,
                                      bytes(ent.body).decode("utf-8", "backslashreplace"), ent.chain_crc)
        return out
    except Exception as e:
        return MemberLog(member, "store", -1, error=f"{type(e).__name__}: {e}")
    finally:
        store.close()


def load_final(path: Path) -> FinalState:
    data: dict[str, Any] = json.loads(path.read_text())
    return FinalState.from_json(data)
