"""`python -m dledger.sim --seeds N [--start S] [--steps K] [--trace] [--membership] [--controller | --brokers |
--idempotent]`: run
simulation seeds (--controller: every member runs the controller's state machine, sim.controller;
--brokers: controllers and a broker set, sim.brokers)."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from dledger.sim.schedule import run_seed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--trace", action="store_true", help="print the trace of every failing seed")
    ap.add_argument("--controller", action="store_true", help="members run the controller (docs/controller.md)")
    ap.add_argument("--brokers", action="store_true", help="controllers and a broker set (AutoSwitch HA, sim.brokers)")
    ap.add_argument("--membership", action="store_true",
                    help="membership changes among the faults: learners added, promoted, voters and leaders removed")
    ap.add_argument("--idempotent", action="store_true",
                    help="appends from idempotent producers, checked for bodies stored twice (sim.producers)")
    args = ap.parse_args()
    logging.disable(logging.CRITICAL)  # members log every fault they see; the report says what matters
    if args.brokers:
        return _brokers(args.start, args.seeds, args.trace)
    t0 = time.monotonic()
    failed = 0
    acked = faults = installs = reads = changes = configs = 0
    for seed in range(args.start, args.start + args.seeds):
        rep = run_seed(seed, args.steps, "controller" if args.controller else "kv", args.idempotent, args.membership)
        acked += rep.acked
        faults += rep.faults
        installs += rep.installs
        reads += rep.reads
        changes += rep.changes
        configs += rep.configs
        if not rep.ok:
            failed += 1
            print(rep.summary())
            for v in rep.violations:
                print("  violation:", v)
            if args.trace:
                print("\n".join("  " + t for t in rep.trace[-60:]))
    print(f"{args.seeds} seeds, {failed} failed, {acked} acknowledged appends checked, {faults} faults, "
          f"{installs} snapshots installed, {reads} linearizable reads checked, "
          + (f"{changes} membership changes asked, {configs} configurations committed, " if args.membership else "")
          + f"{time.monotonic() - t0:.1f} s")
    return 1 if failed else 0


def _brokers(start: int, seeds: int, trace: bool) -> int:
    from dledger.sim.brokers import run_broker_seed

    t0 = time.monotonic()
    failed = acked = faults = elections = async_flush = 0
    for seed in range(start, start + seeds):
        rep = run_broker_seed(seed)
        acked, faults, elections = acked + rep.acked, faults + rep.faults, elections + rep.elections
        async_flush += rep.flush == "async"
        if not rep.ok:
            failed += 1
            print(rep.summary())
            for v in rep.violations:
                print("  violation:", v)
            if trace:
                print("\n".join("  " + t for t in rep.trace[-80:]))
    print(f"{seeds} seeds ({async_flush} flush=async), {failed} failed, {acked} acknowledged sends checked, "
          f"{faults} faults, {elections} master epochs, {time.monotonic() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
