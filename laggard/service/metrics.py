"""Prometheus metrics in the plain text exposition format (no client library needed).

Per job: irregular (1/0), stuck (1/0), slowdown, GPU-hours lost, and each candidate's score;
for the service: summaries received and rejected, ingest latency, localization time.
"""

from __future__ import annotations

import threading
from typing import Any

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**kv: object) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in kv.items()) + "}"


class Metrics:
    def __init__(self) -> None:
        self.received: dict[str, int] = {}
        self.rejected: dict[str, int] = {}
        self.localize_s: dict[str, float] = {}
        self._verdicts: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._buckets = [0] * len(BUCKETS)
        self._count = 0
        self._sum = 0.0

    def set_verdict(self, job: str, verdict: dict[str, Any], report: dict[str, Any]) -> None:
        with self._lock:
            self._verdicts[job] = (verdict, report)

    def observe_ingest(self, seconds: float) -> None:
        with self._lock:
            self._count += 1
            self._sum += seconds
            for i, b in enumerate(BUCKETS):
                if seconds <= b:
                    self._buckets[i] += 1

    def exposition(self) -> str:
        out: list[str] = []

        def family(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {help}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(f"{name}{labels} {value:g}" for labels, value in samples)

        with self._lock:
            verdicts = dict(self._verdicts)
            buckets, count, total = list(self._buckets), self._count, self._sum
        family("laggard_job_irregular", "gauge", "1 when the job's latest verdict is irregular or hang",
               [(_labels(job=j), float(v["status"] in ("irregular", "hang"))) for j, (v, _) in verdicts.items()])
        family("laggard_job_hang", "gauge", "1 when the job is stuck in a collective",
               [(_labels(job=j), float(v["status"] == "hang")) for j, (v, _) in verdicts.items()])
        family("laggard_job_slowdown", "gauge", "irregular iteration time over the baseline (1 = none)",
               [(_labels(job=j), float(v["slowdown"])) for j, (v, _) in verdicts.items()])
        family("laggard_job_gpu_hours_lost", "gauge", "extra wall time x GPUs over the localization window",
               [(_labels(job=j), float(r.get("gpu_hours_lost", 0.0))) for j, (_, r) in verdicts.items()])
        cand = []
        for j, (v, r) in verdicts.items():
            devices = [c.get("device", "") for c in r.get("candidates", [])]
            for i, c in enumerate(v.get("candidates", [])):
                device = devices[i] if i < len(devices) else c.get("kind", "")
                cand.append((_labels(job=j, rank_order=i + 1, kind=c.get("kind", ""), device=device),
                             float(c.get("score", 0.0))))
        family("laggard_candidate_score", "gauge", "root-cause candidate score, 0..1 (rank_order 1 = best)", cand)
        family("laggard_summaries_received_total", "counter", "sidecar summaries stored",
               [(_labels(job=j), float(n)) for j, n in sorted(self.received.items())])
        family("laggard_summaries_rejected_total", "counter", "posts refused, by reason",
               [(_labels(reason=k), float(n)) for k, n in sorted(self.rejected.items())])
        family("laggard_localize_seconds", "gauge", "time of the job's last localization",
               [(_labels(job=j), s) for j, s in sorted(self.localize_s.items())])
        out.append("# HELP laggard_ingest_seconds time to validate and commit one summary")
        out.append("# TYPE laggard_ingest_seconds histogram")
        out.extend(f'laggard_ingest_seconds_bucket{{le="{b:g}"}} {n}' for b, n in zip(BUCKETS, buckets, strict=True))
        out.append(f'laggard_ingest_seconds_bucket{{le="+Inf"}} {count}')
        out.append(f"laggard_ingest_seconds_sum {total:g}")
        out.append(f"laggard_ingest_seconds_count {count}")
        return "\n".join(out) + "\n"
