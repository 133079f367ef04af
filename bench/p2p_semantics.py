"""When does a point-to-point send complete? `python -m bench.p2p_semantics [--backend nccl|gloo] [--quick]`.

The localizer must hold whether a send completes alone (eager: the data is buffered) or only once
its receiver has posted (rendezvous: the send waits for a late receiver). This measures which one the
backend at hand does, by message size: two ranks under torchrun, the receiver posting its receive
`--late-ms` after the sender posted its send. A send that took about that long waited for its
receiver; one that took the transfer's own time did not. `--backend nccl` times on the GPU (the send
is done when the GPU is); ranks that share one GPU declare their own NCCL host (NCCL refuses two
ranks of one host on one device), so their traffic takes NCCL's network transport, as between nodes.
The backend defaults to nccl where a GPU is, gloo elsewhere. Prints one line per size and exits 0;
exits 2 when the backend cannot run here (nccl without a GPU). --quick: three sizes, one exchange each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = ("1KiB", "64KiB", "1MiB", "4MiB", "16MiB", "64MiB")
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def size_bytes(text: str) -> int:
    """'64KiB' -> 65536."""
    for unit, scale in UNITS.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


def verdict(send_ms: float, late_ms: float) -> str:
    """What the send's time says of the backend's semantics for that size."""
    if send_ms >= 0.6 * late_ms:
        return "waited for its receiver (rendezvous)"
    if send_ms <= 0.25 * late_ms:
        return "completed alone (eager)"
    return "partly waited"


def worker(a: argparse.Namespace) -> None:
    """One rank: rank 0 sends, rank 1 receives late; rank 0 writes the figures to `a.out`."""
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    device = torch.device("cpu")
    if a.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        if torch.cuda.device_count() < 2:
            os.environ["NCCL_HOSTID"] = f"p2p-semantics-{rank}"
    dist.init_process_group(a.backend)
    host = dist.new_group(backend="gloo")  # aligns the two hosts without touching the GPU

    def done() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def exchange(x: torch.Tensor, late_ms: float) -> float:
        """One send/receive with the receiver `late_ms` late; the sender's post-to-completion (ms)."""
        dist.barrier(group=host)
        if rank == 0:
            t0 = time.perf_counter()
            dist.send(x, 1)
            done()
            return (time.perf_counter() - t0) * 1e3
        time.sleep(late_ms / 1e3)
        dist.recv(x, 0)
        done()
        return 0.0

    rows = []
    for text in a.sizes.split(","):
        n = size_bytes(text)
        x = torch.ones(max(1, n // 4), device=device)
        exchange(x, 0.0)  # the first transfer sets the connection up
        alone = statistics.median(exchange(x, 0.0) for _ in range(a.reps))
        late = statistics.median(exchange(x, a.late_ms) for _ in range(a.reps))
        rows.append({"size": text, "bytes": n, "send_ms": late, "alone_ms": alone})
    if rank == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        Path(a.out).write_text(json.dumps({"backend": a.backend, "device": name, "torch": torch.__version__,
                                           "nccl": ".".join(map(str, torch.cuda.nccl.version()))
                                           if device.type == "cuda" else "",
                                           "late_ms": a.late_ms, "rows": rows}))
    dist.barrier(group=host)
    dist.destroy_process_group()


def report(res: dict[str, object]) -> str:
    """The figures as a table, one line per size."""
    late = float(res["late_ms"])  # type: ignore[arg-type]
    nccl = f" (NCCL {res['nccl']})" if res["nccl"] else ""
    lines = [f"{res['backend']}{nccl} on {res['device']}, torch {res['torch']}: the receiver posts {late:.0f} ms "
             "after the sender", f"{'size':>8s}  {'send, receiver late':>19s}  {'send, both on time':>18s}  the send"]
    for r in res["rows"]:  # type: ignore[attr-defined]
        lines.append(f"{r['size']:>8s}  {r['send_ms']:16.2f} ms  {r['alone_ms']:15.2f} ms  "
                     f"{verdict(r['send_ms'], late)}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("nccl", "gloo"), help="default: nccl where a GPU is, else gloo")
    ap.add_argument("--sizes", default=",".join(SIZES), help="message sizes, e.g. 1KiB,4MiB")
    ap.add_argument("--late-ms", type=float, default=100.0, help="how late the receiver posts")
    ap.add_argument("--reps", type=int, default=3, help="exchanges per size (the median is shown)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON instead")
    ap.add_argument("--quick", action="store_true", help="1KiB, 4MiB and 16MiB, one exchange each")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return 0
    import torch

    a.backend = a.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if a.backend == "nccl" and not torch.cuda.is_available():
        print("p2p_semantics: --backend nccl needs a CUDA GPU; use --backend gloo here", file=sys.stderr)
        return 2
    if a.quick:
        a.sizes, a.reps = "1KiB,4MiB,16MiB", 1
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p2p.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "NCCL_SOCKET_IFNAME": "lo",
               "GLOO_SOCKET_IFNAME": "lo"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "bench.p2p_semantics", "--worker", "--out", str(out), "--backend", a.backend,
               "--sizes", a.sizes, "--late-ms", str(a.late_ms), "--reps", str(a.reps)]
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        if p.returncode != 0 or not out.exists():
            print(f"p2p_semantics: the two-rank job failed (exit {p.returncode}):\n{p.stderr[-3000:]}", file=sys.stderr)
            return 1
        res = json.loads(out.read_text())
    print(json.dumps(res) if a.json else report(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
