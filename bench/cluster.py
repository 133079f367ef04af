"""The summary-first localizer on a local Dask cluster against one process (issue 17).

    python -m bench.cluster                      # 2048 GPUs x 20 steps, workers capped at 1 GiB
    python -m bench.cluster --gpus 4096 --worker-memory 1.5GiB --skip-full
    python -m bench.cluster --quick              # 256 GPUs: a smoke run
    python -m bench.cluster --memory 2048,4096   # only `laggard localize --commops`: peak RSS, bytes/row
    python -m bench.cluster --memory 16384       # issue 17's scale (runs with 14 GiB available only)

Simulates a job with one slow GPU, lays its CommOps out one Parquet shard per host (as the
node sidecars keep them), then measures, each in a fresh process:
- the full single-process localizer (`laggard localize --commops`, the CLI itself with --memory):
  peak RSS, bytes per row;
- the summary-first localizer in one process (`laggard localize --summary-first`): peak RSS,
  bytes per row (target <= 150);
- the same on a LocalCluster of 1 and of 2 worker processes, each with a memory limit below
  what the full path needs: wall time, map-stage time and its speedup 2 vs 1 workers, peak
  RSS per worker, bytes of results shipped to the client and bytes sent by workers;
and checks every verdict against the single-process summary-first one (byte for byte) and
the injected fault.

Targets: identical verdicts; worker peak bounded (under the cap); map stage >= 1.7x faster on
2 workers than on 1 (a 2-core machine: say how loaded it was; the load average is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def shard_by_host(src: Path, out: Path) -> int:
    """Copy a trace's commops.parquet into `out/commops/<host>.parquet`, streaming row groups."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from collector.trace.meta import JobMeta

    meta = JobMeta.load(src / "meta.json")
    (out / "commops").mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "meta.json", out / "meta.json")
    hosts = meta.hosts()
    code = {h: i for i, h in enumerate(hosts)}
    host_of = np.full(max(meta.ranks) + 1, -1, dtype=np.int64)
    for r, info in meta.ranks.items():
        host_of[r] = code[info.host]
    pf = pq.ParquetFile(src / "commops.parquet")
    writers: dict[int, pq.ParquetWriter] = {}
    rows = 0
    try:
        for g in range(pf.num_row_groups):
            t = pf.read_row_group(g)
            h = host_of[t["rank"].to_numpy()]
            order = np.argsort(h, kind="stable")
            t = t.take(pa.array(order))
            hs = h[order]
            cuts = np.flatnonzero(np.diff(hs)) + 1
            for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(hs)], strict=True):
                k = int(hs[lo])
                if k not in writers:
                    writers[k] = pq.ParquetWriter(out / "commops" / f"{hosts[k]}.parquet", t.schema, compression="zstd")
                writers[k].write_table(t.slice(lo, hi - lo))
            rows += t.num_rows
    finally:
        for w in writers.values():
            w.close()
    return rows


def _child(code: str, timeout: float) -> dict[str, Any]:
    """Run `code` in a fresh interpreter; it prints one JSON line; add its peak RSS and wall time."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    pre = ("import json, resource, sys, time\n"
           "t0 = time.perf_counter()\n")
    post = ("\nout['wall_s'] = round(time.perf_counter() - t0, 2)\n"
            "out['peak_rss_mib'] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n"
            "print(json.dumps(out))\n")
    p = subprocess.run([sys.executable, "-c", pre + code + post], capture_output=True, text=True, env=env,
                       timeout=timeout, cwd=REPO)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1], "rc": p.returncode}
    return json.loads(p.stdout.strip().splitlines()[-1])


def cli_path(trace: Path, timeout: float) -> dict[str, Any]:
    """`laggard localize TRACE --commops` as a user runs it (its allocator settings included), in a
    fresh process: peak RSS (the child's, from wait4), wall time and the top candidate's rank."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "laggard.cli", "localize", str(trace), "--commops", "--format", "json"]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode()
    if rc not in (0, 1):
        return {"error": f"exit {rc}" + (f" (killed after {timeout:.0f} s)" if rc < 0 else "")}
    cands = json.loads(text).get("candidates") or [{}]
    return {"top": cands[0].get("rank"), "wall_s": round(time.perf_counter() - t0, 2),
            "peak_rss_mib": round(usage.ru_maxrss / 1024)}


def full_path(trace: Path, timeout: float) -> dict[str, Any]:
    return _child(
        "from collector.trace.traceio import Trace\nfrom localize.combine import localize_trace\n"
        f"v = localize_trace(Trace.open({str(trace)!r}), ('commops',))\n"
        "out = {'top': v.candidates[0].rank if v.candidates else None, 'status': v.status}", timeout)


def serial_path(trace: Path, timeout: float) -> dict[str, Any]:
    return _child(
        "from localize.distributed import Serial, Source, localize_distributed\n"
        f"v, plan = localize_distributed(Source.open({str(trace)!r}), Serial())\n"
        "out = {'verdict': json.dumps(v.to_dict()), 'rows_fetched': plan.rows_fetched}", timeout)


def cluster_path(trace: Path, workers: int, memory: str, timeout: float) -> dict[str, Any]:
    return _child(
        "from laggard.cluster import open_cluster\n"
        "from localize.distributed import Source, Stats, localize_distributed\n"
        f"src = Source.open({str(trace)!r})\n"
        f"with open_cluster('local', {workers}, {memory!r}) as run:\n"
        "    run.client.run(lambda: __import__('localize.distributed'))  # imports are not the map stage\n"
        "    st = Stats(); t1 = time.perf_counter()\n"
        "    v, plan = localize_distributed(src, run, stats=st)\n"
        "    w = run.worker_stats()\n"
        "    out = {'verdict': json.dumps(v.to_dict()), 'localize_s': round(time.perf_counter() - t1, 2),\n"
        "           'map_s': round(run.stage_s.get('summarize_hosts', 0.0), 2),\n"
        "           'fetch_s': round(run.stage_s.get('fetch_rows', 0.0), 2),\n"
        "           'map_tasks': st.map_tasks, 'fetch_tasks': st.fetch_tasks, 'result_bytes': run.result_bytes,\n"
        "           'worker_peak_rss_mib': sorted(round(x['peak_rss_bytes'] / 2**20) for x in w.values()),\n"
        "           'worker_sent_bytes': sorted(x['sent_bytes'] for x in w.values()),\n"
        "           'worker_received_bytes': sorted(x['received_bytes'] for x in w.values())}\n", timeout)


def simulate(tmp: Path, gpus: int, steps: int) -> tuple[Path, dict[str, Any], int]:
    """The benchmark's job: tp=8, pp=8 (2 under 512 GPUs), one GPU twice as slow in the second half."""
    from simulator.config import FaultSpec, SimConfig
    from simulator.writer import simulate_trace

    bad = gpus // 3 + 1
    cfg = SimConfig(gpus=gpus, tp=8, pp=8 if gpus >= 512 else 2, steps=steps, seed=17,
                    faults=[FaultSpec.parse(f"gpu:rank={bad},factor=2,steps={steps // 2}:{steps - 1}")])
    sim = tmp / "sim"
    return sim, simulate_trace(cfg, sim, counterfactual=False), bad


def simulate_apart(tmp: Path, gpus: int, steps: int, timeout: float) -> tuple[Path, int, int]:
    """`simulate` in a child process, so that this one does not hold the simulator's memory
    while the measured process runs beside it: (trace, rows, the slow GPU's rank)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    code = f"from pathlib import Path\nfrom bench.cluster import simulate\nsimulate(Path({str(tmp)!r}), {gpus}, {steps})\n"
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO, timeout=timeout,
                   stdout=subprocess.DEVNULL)
    sim = tmp / "sim"
    return sim, int(json.loads((sim / "truth.json").read_text())["rows"]), gpus // 3 + 1


def available_gib() -> float:
    """MemAvailable of /proc/meminfo in GiB (inf where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


#: scales above this many GPUs run only with LARGE_FREE_GIB available (the machine is shared)
SHARED_MAX_GPUS = 8192
LARGE_FREE_GIB = 14.0


def memory(scales: list[int], steps: int, timeout: float) -> int:
    """Peak RSS of `laggard localize --commops` per operator row analysed, at each scale (issue
    17's target: <= 150 bytes per row, i.e. 16,384 GPUs x 20 steps within 10 GB)."""
    print(f"load average before: {os.getloadavg()[0]:.1f} (2 cores shared: wall times vary, peaks do not)")
    print(f"{'gpus':>6} {'rows':>11} {'peak MiB':>9} {'B/row':>6} {'wall s':>7}  top-1 right")
    ok = True
    for gpus in scales:
        if gpus > SHARED_MAX_GPUS and available_gib() < LARGE_FREE_GIB:
            print(f"{gpus:>6} skipped: {available_gib():.1f} GiB available, {LARGE_FREE_GIB:.0f} needed")
            continue
        with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
            sim, rows, bad = simulate_apart(Path(tmp), gpus, steps, timeout)
            run = cli_path(sim, timeout)
        if "peak_rss_mib" not in run:
            print(f"{gpus:>6} {rows:>11,} failed: {run.get('error')}")
            ok = False
            continue
        per_row = run["peak_rss_mib"] * 2**20 / rows
        print(f"{gpus:>6} {rows:>11,} {run['peak_rss_mib']:>9,} {per_row:>6.0f} {run['wall_s']:>7.1f}  "
              f"{run['top'] == bad}", flush=True)
        ok &= run["top"] == bad
    print("(peak RSS of a fresh `laggard localize --commops`, the interpreter and libraries included: "
          f"~170 MiB before any row); load average after: {os.getloadavg()[0]:.1f}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--worker-memory", default="1GiB", help="memory limit per worker (default 1GiB)")
    ap.add_argument("--skip-full", action="store_true", help="do not run the full single-process localizer")
    ap.add_argument("--quick", action="store_true", help="256 GPUs, 12 steps")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--memory", default=None, metavar="GPUS,...",
                    help="only the full one-process localizer at these scales: peak RSS and bytes per row")
    args = ap.parse_args(argv)
    if args.quick:
        args.gpus, args.steps = 256, 12
    scales = [int(x) for x in args.memory.split(",")] if args.memory else [args.gpus]
    if args.memory:
        return memory(scales, args.steps, args.timeout)
    if max(scales) > SHARED_MAX_GPUS:
        ap.error(f"at most {SHARED_MAX_GPUS} GPUs on a shared machine (--memory runs larger ones when memory allows)")

    res: dict[str, Any] = {"gpus": args.gpus, "steps": args.steps, "worker_memory": args.worker_memory,
                           "load_avg_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        sharded = Path(tmp) / "sharded"
        t0 = time.perf_counter()
        sim, truth, bad = simulate(Path(tmp), args.gpus, args.steps)
        res["rows"] = truth["rows"]
        res["simulate_s"] = round(time.perf_counter() - t0, 1)
        shard_by_host(sim, sharded)
        res["hosts"] = len(list((sharded / "commops").glob("*.parquet")))
        res["commops_bytes"] = (sim / "commops.parquet").stat().st_size
        if not args.skip_full:
            full = full_path(sim, args.timeout)
            if "peak_rss_mib" in full:
                full["bytes_per_row"] = round(full["peak_rss_mib"] * 2**20 / truth["rows"])
            res["full_single_process"] = full
        ref = serial_path(sharded, args.timeout)
        verdict = ref.pop("verdict", None)
        if "peak_rss_mib" in ref:  # issue 17's one-process target: <= 150 bytes per operator row
            ref["bytes_per_row"] = round(ref["peak_rss_mib"] * 2**20 / truth["rows"])
        res["summary_single_process"] = ref
        top = json.loads(verdict)["candidates"][0].get("rank") if verdict else None
        res["summary_top_is_fault"] = top == bad
        for n in (1, 2):
            run = cluster_path(sharded, n, args.worker_memory, args.timeout)
            run["identical_to_single_process"] = run.pop("verdict", None) == verdict
            res[f"cluster_{n}_workers"] = run
        one, two = res["cluster_1_workers"], res["cluster_2_workers"]
        if one.get("map_s") and two.get("map_s"):
            res["map_speedup_2_vs_1"] = round(one["map_s"] / two["map_s"], 2)
    res["load_avg_after"] = os.getloadavg()
    print(json.dumps(res, indent=1))
    ok = all(res[f"cluster_{n}_workers"].get("identical_to_single_process") for n in (1, 2)) and res["summary_top_is_fault"]
    print(f"verdicts identical and right: {ok}; map stage 2 vs 1 workers: {res.get('map_speedup_2_vs_1')}x "
          f"(target 1.7x); load average {res['load_avg_before'][0]:.1f} before, {res['load_avg_after'][0]:.1f} after")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
