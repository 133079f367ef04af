"""Run a training script with the CommOps logger attached, no code change:

    LAGGARD_COMMOPS_DIR=/data/run7 torchrun --nproc-per-node 8 -m collector.commops.run train.py ARGS
    LAGGARD_COMMOPS_DIR=/data/run7 python -m collector.commops.run -m mypkg.train ARGS
"""

from __future__ import annotations

import os
import runpy
import sys

from collector import commops


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        raise SystemExit(0 if argv else 2)
    if not commops.attach():
        print(f"laggard commops: {commops.ENV_DIR} is not set; running without the logger", file=sys.stderr)
    if argv[0] == "-m" and len(argv) > 1:
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
