"""Streaming pipeline on dledger with Spark: append events, stream them into Parquet,
stop the query midway, restart it from its checkpoint, and check exactly-once output.

    python examples/pipeline.py                 # starts its own local 3-member group
    python examples/pipeline.py --peers 'n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913'

Needs `pip install 'dledger[spark]'` and Java 17. Exit code 0 when the check passes.
"""

from __future__ import annotations

import argparse
import logging
import sys

from dledger.spark.pipeline_demo import run_pipeline_demo


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", help="use this group instead of starting a local one")
    ap.add_argument("--group", default="default")
    ap.add_argument("--base-dir", help="keep the cluster data, Parquet output and checkpoint here")
    ap.add_argument("--master", default="local[2]", help="Spark master URL [local[2]]")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    ok = run_pipeline_demo(args.base_dir, peers=args.peers, group=args.group, master=args.master)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
