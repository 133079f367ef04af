"""Load test of `laggard serve` on loopback: the sidecars of a 16,384-GPU job (2,048 nodes).

Every node posts one summary (the node agent's wire format) every 10 s, staggered over the
period, for a bounded time; a slow GPU is injected so the summaries carry what the agents would
see (its longer compute, its TP peers' and its stage's DP peers' abnormal operators). Agents retry
a failed post like a real one would (posts are idempotent). Prints the offered and sustained
rate, ingest latency percentiles, how late posts started against their schedule, and summaries
lost (stored vs sent), then runs one summary-first round and prints which ranks' records it asks
for, against the injected rank.

    python -m bench.serve               # 2,048 nodes x 3 periods of 10 s
    python -m bench.serve --quick       # 256 nodes x 2 periods
    python -m bench.serve --kill9-at 15 # kill -9 the service mid-run, restart it: 0 acknowledged posts lost
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

GPUS_PER_NODE, PP = 8, 4
TP_OPS_PER_STEP = 4
STEP_S, SLOW_STEP_S = 2.0, 2.6
JOB = "bench-16k"


def layout(nodes: int) -> tuple[int, int]:
    world = nodes * GPUS_PER_NODE
    return world, world // (GPUS_PER_NODE * PP)  # world, dp


def node_groups(node: int, nodes: int) -> dict[str, str]:
    """Megatron order tp-dp-pp: rank = tp + 8 * (dp + DP * pp); each group as 'start:stop:step'."""
    _, dp_size = layout(nodes)
    dp, pp = node % dp_size, node // dp_size
    groups = {f"tp-{node}": f"{node * 8}:{node * 8 + 8}:1"}
    for t in range(GPUS_PER_NODE):
        first = t + 8 * dp_size * pp
        groups[f"dp-{t}-{pp}"] = f"{first}:{first + 8 * dp_size}:8"
        groups[f"pp-{t}-{dp}"] = f"{t + 8 * dp}:{t + 8 * (dp + dp_size * PP)}:{8 * dp_size}"
    return groups


def summary(node: int, window: int, nodes: int, slow_rank: int, period: float, rng: np.random.Generator) -> dict[str, Any]:
    """One node's post for one period, in the node agent's wire format (localize/summary.py rows)."""
    world, dp_size = layout(nodes)
    slow_node = slow_rank // 8
    faulty = window >= 1  # the GPU turns slow after the first window
    steps_per_window = int(period / STEP_S)
    first = window * steps_per_window
    ranks = list(range(node * 8, node * 8 + 8))
    same_stage = node // dp_size == slow_node // dp_size
    t0 = 1_760_000_000_000_000 + int(window * period * 1e6)  # microseconds, this host's clock
    rows: dict[str, list[Any]] = {c: [] for c in ("rank", "step", "group", "abnormal", "abnormal_us", "compute_us",
                                                  "step_end_us")}

    def row(rank: int, step: int, group: str, abnormal: int, abnormal_us: int, compute_us: int, end_us: int) -> None:
        for c, v in zip(rows, (rank, step, group, abnormal, abnormal_us, compute_us, end_us), strict=True):
            rows[c].append(v)

    end = t0
    for i, step in enumerate(range(first, first + steps_per_window)):
        dur = (SLOW_STEP_S if faulty else STEP_S) * (1 + 0.01 * rng.random())
        end = t0 + int((i + 1) * dur * 1e6)
        compute = int(1.6e6 * (1 + 0.01 * rng.random()))
        row(-1, step, "*", 0, 0, compute, end)
        if not faulty:
            continue
        if node == slow_node:  # the slow GPU computes longer; its TP peers wait on it
            row(slow_rank, step, "*", 0, 0, int(compute * 1.35), end)
            row(-1, step, f"tp-{node}", 7 * TP_OPS_PER_STEP, int(7 * TP_OPS_PER_STEP * 0.15e6), 0, 0)
        elif same_stage:  # DP peers wait on the slow node's ranks in the gradient reduce-scatter
            for t in range(GPUS_PER_NODE):
                row(-1, step, f"dp-{t}-{node // dp_size}", 1, int(0.6e6 * (1 + 0.02 * rng.random())), 0, 0)
    return {"job": JOB, "node": f"node-{node}", "window": window, "first_step": first,
            "last_step": first + steps_per_window - 1, "world_size": world,
            "ranks": {str(r): {"gpu": r % 8} for r in ranks}, "groups": node_groups(node, nodes), "rows": rows}


class Connections:
    """A small keep-alive HTTP/1.1 client on asyncio streams: the load generator shares the CPU
    with the server under test, so it must cost far less per post than the server does."""

    def __init__(self, host: str, port: int, size: int) -> None:
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.sem = asyncio.Semaphore(size)

    async def post(self, path: str, body: bytes) -> int:
        async with self.sem:
            conn = self.idle.pop() if self.idle else await asyncio.open_connection(self.host, self.port)
            reader, writer = conn
            try:
                writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = next((int(h.split(b":", 1)[1]) for h in head.split(b"\r\n")
                               if h.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                writer.close()
                raise
            self.idle.append(conn)
            return status

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def sidecars(port: int, nodes: int, windows: int, period: float, slow_rank: int,
                   concurrency: int) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    bodies = {(w, n): json.dumps(summary(n, w, nodes, slow_rank, period, rng)).encode()
              for w in range(windows) for n in range(nodes)}
    offsets = rng.random(nodes) * period  # each node's phase within the period
    latency: list[float] = []
    lateness: list[float] = []
    sent_at: list[float] = []
    failed: list[tuple[int, int]] = []
    conns = Connections("127.0.0.1", port, concurrency)
    start = time.perf_counter() + 0.5

    async def post(w: int, n: int) -> None:
        due = start + w * period + offsets[n]
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        give_up = time.perf_counter() + 90  # an agent retries (and spools); (job, node, window) makes it idempotent
        while time.perf_counter() < give_up:
            t = time.perf_counter()
            try:
                if await conns.post("/v1/summaries", bodies[(w, n)]) == 202:
                    latency.append(time.perf_counter() - t)
                    lateness.append(t - due)
                    sent_at.append(t - start)
                    return
            except (OSError, asyncio.IncompleteReadError, ValueError):
                pass
            await asyncio.sleep(0.5)
        failed.append((w, n))

    await asyncio.gather(*(post(w, n) for w in range(windows) for n in range(nodes)))
    elapsed = time.perf_counter() - start
    conns.close()
    return {"latency": np.array(latency), "sent_at": np.array(sent_at), "lateness": np.array(lateness), "failed": failed, "elapsed": elapsed,
            "bytes": sum(map(len, bodies.values())), "sent": len(bodies)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def histogram_quantile(text: str, name: str, q: float) -> float:
    """The upper bound of the bucket holding quantile q of a Prometheus histogram."""
    buckets = [(float(ln.split('le="')[1].split('"')[0]), float(ln.rsplit(" ", 1)[1]))
               for ln in text.splitlines() if ln.startswith(name)]
    total = buckets[-1][1]
    return next(le for le, n in buckets if n >= q * total)


def wait_up(base: str, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return True
        except httpx.TransportError:
            time.sleep(0.2)
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=3, help="periods each node posts in (bounded run)")
    ap.add_argument("--period", type=float, default=10.0, help="seconds between a node's posts")
    ap.add_argument("--concurrency", type=int, default=64, help="connections (posts in flight) at most")
    ap.add_argument("--quick", action="store_true", help="256 nodes, 2 periods")
    ap.add_argument("--localize-every", type=float, default=10.0, help="the service's --interval")
    ap.add_argument("--kill9-at", type=float, default=0.0,
                    help="kill -9 the service this many seconds into the run and restart it on the same state")
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.windows = 256, 2
    world, dp_size = layout(args.nodes)
    slow_rank = (args.nodes // 3) * 8 + 5
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="laggard-bench-serve-") as tmp:
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        cmd = [sys.executable, "-m", "laggard", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--db", str(Path(tmp) / "state.db"), "--interval", str(args.localize_every)]
        servers = [subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)]
        server = servers[0]
        try:
            if not wait_up(base):
                print("server did not start", file=sys.stderr)
                return 1
            budget = args.windows * args.period + 120
            cpu0 = cpu_seconds(server.pid)
            killer = None
            if args.kill9_at > 0:  # kill -9 mid-run and start again on the same state: acknowledged posts must survive
                def kill_and_restart() -> None:
                    servers[-1].kill()
                    servers[-1].wait()
                    servers.append(subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL))

                killer = threading.Timer(args.kill9_at, kill_and_restart)
                killer.start()
            res = asyncio.run(asyncio.wait_for(
                sidecars(port, args.nodes, args.windows, args.period, slow_rank, args.concurrency), budget))
            if killer is not None:
                killer.join()
            server = servers[-1]
            ingest_cpu = cpu_seconds(server.pid) - (cpu0 if len(servers) == 1 else 0.0)
            stored = httpx.get(f"{base}/v1/jobs/{JOB}/stats", timeout=30).json()["summaries"]
            t = time.perf_counter()
            planned = httpx.post(f"{base}/v1/jobs/{JOB}/localize", timeout=300).json()
            localize_s = time.perf_counter() - t
            metrics = httpx.get(base + "/metrics", timeout=30).text
            server_p99 = histogram_quantile(metrics, 'laggard_ingest_duration_seconds_bucket{kind="summary",', 0.99)
        finally:
            for srv in servers:
                if srv.poll() is None:
                    srv.terminate()
                    srv.wait(timeout=30)
    lat, late = res["latency"] * 1e3, res["lateness"] * 1e3
    ok = len(lat)
    fetch = planned.get("fetch", {})
    asked = sorted(int(r) for v in fetch.values() for r in v["ranks"])
    print(f"job: {world:,} GPUs on {args.nodes:,} nodes (tp 8, pp {PP}, dp {dp_size}); "
          f"each node posts every {args.period:g} s for {args.windows} periods; slow GPU rank {slow_rank}")
    print(f"summaries sent:       {res['sent']:,} ({res['bytes'] / 1e6:.1f} MB) in {res['elapsed']:.1f} s")
    print(f"offered rate:         {args.nodes / args.period:.1f} summaries/s")
    print(f"sustained rate:       {ok / res['elapsed']:.1f} summaries/s accepted")
    print(f"ingest latency:       (client side, queueing included) p50 {np.percentile(lat, 50):.1f} ms, p99 {np.percentile(lat, 99):.1f} ms, "
          f"max {lat.max():.1f} ms")
    per = ingest_cpu / max(ok, 1)
    at = res["sent_at"]
    spans = [f"{a:.0f}-{a + 5:.0f}s: {np.percentile(lat[(at >= a) & (at < a + 5)], 99):.0f}"
             for a in np.arange(0, at.max(), 5.0) if ((at >= a) & (at < a + 5)).any()]
    print(f"p99 latency (ms) by time sent: {', '.join(spans)}")
    print(f"server CPU:           {per * 1e3:.2f} ms per summary in the ingest process "
          f"(capacity about {1 / per:.0f} summaries/s per free core; this machine has {os.cpu_count()} "
          f"cores, load average {os.getloadavg()[0]:.1f})")
    print(f"server-side ingest:   p99 <= {server_p99 * 1e3:g} ms from request to commit (histogram bucket)")
    print(f"start lateness:       p99 {np.percentile(late, 99):.1f} ms behind schedule (client backlog)")
    print(f"summaries lost:       {len(lat) - stored} acknowledged but not stored (sent {res['sent']:,}, "
          f"acknowledged {len(lat):,}, stored {stored:,}, never acknowledged: {len(res['failed'])})"
          + (f"; kill -9 at {args.kill9_at:g} s and restart" if args.kill9_at > 0 else ""))
    print(f"summary-first round:  {localize_s:.2f} s over {stored:,} summaries; {planned.get('status')}: asks "
          f"{len(fetch)} node(s) for {len(asked)} rank(s)' records of steps "
          f"{next(iter(fetch.values()))['steps'] if fetch else []} "
          f"({'includes' if slow_rank in asked else 'MISSES'} the slow rank {slow_rank}; the bench has no records "
          f"to answer with: `python -m bench.verdict` times the whole path)")
    keeps_up = ok / res["elapsed"] >= 0.95 * args.nodes / args.period and np.percentile(lat, 99) < args.period * 1e3
    print(f"keeps up:             {'yes' if keeps_up else 'NO'} (sustained >= 95% of offered and p99 < one period)")
    print(f"metrics exposition:   {len(metrics.splitlines())} lines")
    return 0 if res["sent"] == stored and not res["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
