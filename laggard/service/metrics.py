"""Prometheus metrics of the service, with prometheus_client and Prometheus' naming conventions.

Jobs are labelled `job_name` (Prometheus attaches its own `job` label to every scraped series);
a candidate device is labelled by its parts (kind, host, gpu, rank), so a query can join it with
DCGM's `Hostname`/`gpu` or node_exporter's `instance`. A job that has not posted for `ttl_s`
leaves the exposition, so label values do not accumulate forever.
"""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from prometheus_client import (
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

disable_created_metrics()  # the *_created series double the exposition and no rule here needs them
TOP = 3  # candidates exported per job
LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LOCALIZE = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class JobMetrics:
    """What the exposition says about one job; updated by ingest and by each localization."""

    last_post: float = field(default_factory=time.time)
    received: int = 0
    verdict: dict[str, Any] | None = None
    onset: float | None = None
    lost_gpu_s: float = 0.0
    counted_upto: int = -1  # irregular steps up to here are already in lost_gpu_s
    failed: str | None = None
    localized_at: float | None = None


class Metrics(Collector):
    def __init__(self, ttl_s: float = 3600.0) -> None:
        self.ttl_s = ttl_s
        self.jobs: dict[str, JobMetrics] = {}
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(PROCESS_COLLECTOR)
        self.registry.register(PLATFORM_COLLECTOR)
        self.registry.register(self)
        self.ingest = Histogram("laggard_ingest_duration_seconds", "time to validate and commit one post",
                                ["kind"], buckets=LATENCY, registry=self.registry)
        self.localize = Histogram("laggard_localization_duration_seconds", "time of one job's localization",
                                  buckets=LOCALIZE, registry=self.registry)
        self.rejected = Counter("laggard_posts_rejected", "posts refused, by reason", ["reason"],
                                registry=self.registry)
        self.pruned = Counter("laggard_summaries_pruned", "summaries deleted by the retention (--retention, "
                              "--max-rows-per-job)", registry=self.registry)
        self.notify_failed = Counter("laggard_notifications_failed", "alerts that could not be delivered",
                                     registry=self.registry)

    def job(self, name: str) -> JobMetrics:
        with self._lock:
            return self.jobs.setdefault(name, JobMetrics())

    def received(self, job: str, n: int = 1) -> None:
        m = self.job(job)
        m.received += n
        m.last_post = time.time()

    def set_verdict(self, job: str, verdict: dict[str, Any], onset: float | None = None,
                    lost_s: dict[int, float] | None = None, world: int = 0) -> None:
        m = self.job(job)
        m.verdict, m.failed, m.localized_at = verdict, None, time.time()
        m.onset = onset if verdict.get("status") != "healthy" else None
        fresh = {s: v for s, v in (lost_s or {}).items() if s > m.counted_upto}
        if fresh:
            m.lost_gpu_s += sum(fresh.values()) * max(world, 1)
            m.counted_upto = max(fresh)

    def set_failed(self, job: str, reason: str) -> None:
        self.job(job).failed = reason

    def expire(self) -> list[str]:
        """Forget jobs idle for longer than the ttl; returns their names."""
        cut = time.time() - self.ttl_s
        with self._lock:
            gone = [j for j, m in self.jobs.items() if m.last_post < cut]
            for j in gone:
                del self.jobs[j]
        return gone

    def collect(self) -> Iterator[Metric]:
        self.expire()
        with self._lock:
            jobs = sorted(self.jobs.items())
        info = InfoMetricFamily("laggard_build", "version of the laggard service")
        info.add_metric([], {"version": _version(), "python": platform.python_version()})
        yield info
        fams = {
            "irregular": GaugeMetricFamily("laggard_job_irregular", "1 while the job's steps are irregularly slow",
                                           labels=["job_name"]),
            "hang": GaugeMetricFamily("laggard_job_hang", "1 while the job is stuck in a collective",
                                      labels=["job_name"]),
            "localizing": GaugeMetricFamily("laggard_job_localizing",
                                            "1 while the job is irregular or hung and its root cause awaits "
                                            "confirmation by consecutive rounds", labels=["job_name"]),
            "slowdown": GaugeMetricFamily("laggard_job_slowdown_ratio", "irregular step time over its baseline",
                                          labels=["job_name"]),
            "onset": GaugeMetricFamily("laggard_job_onset_timestamp_seconds",
                                       "when the current irregularity began (Unix time, the hosts' clocks)",
                                       labels=["job_name"]),
            "failed": GaugeMetricFamily("laggard_job_localization_failed",
                                        "1 when the job's last localization failed (see /healthz)", labels=["job_name"]),
            "at": GaugeMetricFamily("laggard_job_last_localization_timestamp_seconds",
                                    "when the job was last localized", labels=["job_name"]),
            "post": GaugeMetricFamily("laggard_job_last_post_timestamp_seconds",
                                      "when an agent of the job last posted", labels=["job_name"]),
            "cand": GaugeMetricFamily("laggard_candidate_score", "root-cause candidate score, 0..1 (position 1 = best)",
                                      labels=["job_name", "position", "kind", "host", "gpu", "rank"]),
        }
        lost = CounterMetricFamily("laggard_job_lost_gpu_seconds", "GPU-seconds lost to irregular steps",
                                   labels=["job_name"])
        received = CounterMetricFamily("laggard_summaries_received", "node summaries stored", labels=["job_name"])
        for name, m in jobs:
            received.add_metric([name], m.received)
            fams["post"].add_metric([name], m.last_post)
            fams["failed"].add_metric([name], 1.0 if m.failed else 0.0)
            if m.verdict is None:
                continue
            v = m.verdict
            lost.add_metric([name], m.lost_gpu_s)
            fams["irregular"].add_metric([name], 1.0 if v.get("status") == "irregular" else 0.0)
            fams["hang"].add_metric([name], 1.0 if v.get("status") == "hang" else 0.0)
            fams["localizing"].add_metric([name], 1.0 if v.get("localizing") else 0.0)
            fams["slowdown"].add_metric([name], float(v.get("slowdown", 1.0)))
            if m.localized_at is not None:
                fams["at"].add_metric([name], m.localized_at)
            if m.onset is not None:
                fams["onset"].add_metric([name], m.onset)
            for i, c in enumerate(v.get("candidates", [])[:TOP], 1):
                host = c.get("host") or "+".join(c.get("hosts") or []) or (c.get("switch") or "")
                fams["cand"].add_metric([name, str(i), str(c.get("kind", "")), host,
                                         "" if c.get("gpu") is None else str(c["gpu"]),
                                         "" if c.get("rank") is None else str(c["rank"])], float(c.get("score", 0.0)))
        yield from fams.values()
        yield lost
        yield received

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _version() -> str:
    try:
        return metadata.version("laggard")
    except metadata.PackageNotFoundError:
        return "unknown"
