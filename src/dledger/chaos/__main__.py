"""`python -m dledger.chaos --seed S --duration 30 --nodes 3|5 --flush async|sync --dir D [--history F]`

Runs one chaos run and prints its summary. Exit codes: 0 no violation, 1 violations
(the summary names the seed and the command that replays it), 2 the run itself failed.
`--check-only` re-runs the checker on a finished run's history and final logs.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
from pathlib import Path

from dledger.chaos.checker import check, format_summary
from dledger.chaos.nemesis import FAULTS_5, FAULTS_ANY
from dledger.chaos.runner import RunConfig, RunError, load_final, run
from dledger.chaos.workload import load_history

log = logging.getLogger("dledger.chaos")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dledger.chaos", description=__doc__.split("\n\n")[1])
    p.add_argument("--seed", type=int, default=None, help="seed of the fault schedule and workload [random]")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of faults [30]")
    p.add_argument("--nodes", type=int, choices=(3, 5), default=3)
    p.add_argument("--flush", choices=("async", "sync"), default="async")
    p.add_argument("--dir", type=Path, default=Path("chaos-run"), help="run directory [chaos-run]")
    p.add_argument("--history", type=Path, default=None, help="history file [DIR/history.jsonl]")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients [4]")
    p.add_argument("--bound", type=float, default=20.0, help="seconds the group may take to serve appends after "
                   "the last fault healed [20]")
    p.add_argument("--faults", default=None,
                   help=f"comma-separated fault kinds [all of {', '.join(FAULTS_ANY + FAULTS_5)}]")
    p.add_argument("--check-only", action="store_true", help="only check DIR's history and final.json again")
    p.add_argument("-v", "--verbose", action="count", default=0)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(a.verbose, 2),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if a.check_only:
        result = check(load_history(a.history or a.dir / "history.jsonl"), load_final(a.dir / "final.json"), a.bound)
        print(format_summary(result, f"check of {a.dir}"))
        return 0 if result.ok else 1
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    faults = tuple(f.strip() for f in a.faults.split(",") if f.strip()) if a.faults else None
    unknown = set(faults or ()) - set(FAULTS_ANY + FAULTS_5)
    if unknown:
        p.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    cfg = RunConfig(seed=seed, duration=a.duration, nodes=a.nodes, flush=a.flush, dir=a.dir, history=a.history,
                    clients=a.clients, availability_bound_s=a.bound, faults=faults)
    try:
        report = run(cfg)
    except RunError as e:
        print(f"chaos run failed (seed {seed}): {e}", file=sys.stderr)
        return 2
    print(report.summary)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
