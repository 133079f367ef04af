#!/usr/bin/env bash
# Rebuild the shipped traces from the simulator (deterministic: same seeds, same bytes).
set -euo pipefail
cd "$(dirname "$0")/.."
LAGGARD=${LAGGARD:-.venv/bin/laggard}
for s in gpu-straggler healthy link-slow host-contention gpu-spike; do
  rm -rf "traces/$s"
  "$LAGGARD" simulate --scenario "$s" --seed 0 --out "traces/$s"
done
du -sh traces
