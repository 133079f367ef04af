#!/usr/bin/env bash
# Rebuild the shipped traces from the simulator (deterministic: same seeds, same bytes).
set -euo pipefail
cd "$(dirname "$0")/.."
LAGGARD=${LAGGARD:-.venv/bin/laggard}
sim() { local name=$1; shift; rm -rf "traces/$name"; "$LAGGARD" simulate --seed 0 --out "traces/$name" "$@"; }
sim gpu-straggler   --scenario gpu-straggler --flows --logs
sim healthy         --scenario healthy --flows --logs
sim link-slow       --scenario link-slow --flows
sim nic-degraded    --scenario nic-degraded --flows
sim host-contention --scenario host-contention
sim gpu-spike       --scenario gpu-spike
sim gpu-xid         --gpus 32 --tp 8 --steps 30 --logs --log-failure gpu_xid --job gpu-xid
du -sh traces
