"""The always-on path end to end, all real: a 4-rank gloo job under torchrun with rank 1 slowed, a
node agent posting to `laggard serve`, Debian's Prometheus scraping the service with the shipped
rules, and the service's own Alertmanager notification."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow.dataset as ds
import pytest

from bench.verdict import fault_start, serve, trial
from tests.conftest import REPO
from tests.laggard.receiver import Receiver

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="prometheus not installed (apt-get install prometheus)")]
JOB = "e2e-gloo"
# a job that ends before two rounds agree (a loaded machine) gets its last round's device once its
# agent said the job ended, well within this many seconds of the agent's exit (not --settle's 30)
AFTER_END_S = 8.0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prometheus(tmp: Path, target: str, alertmanager: str) -> tuple[subprocess.Popen[bytes], str]:
    """Prometheus scraping `target` every second with the shipped rules; only the alert's `for:`
    is shortened (1m -> 2s) so the test does not wait a minute."""
    rules = (REPO / "deploy" / "prometheus" / "rules.yml").read_text()
    assert "for: 1m" in rules
    (tmp / "rules.yml").write_text(rules.replace("for: 1m", "for: 2s"))
    (tmp / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: [rules.yml]
alerting:
  alertmanagers: [{{static_configs: [{{targets: ["{alertmanager}"]}}]}}]
scrape_configs:
  - job_name: laggard
    static_configs: [{{targets: ["{target}"]}}]
""")
    port = _port()
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def _query(prom: str, q: str) -> list[dict[str, Any]]:
    r = httpx.get(prom + "/api/v1/query", params={"query": q}, timeout=5)
    return list(r.json()["data"]["result"]) if r.status_code == 200 else []


def test_slowed_rank_is_named_scraped_and_alerted(tmp_path: Path) -> None:
    t_start = time.monotonic()
    with Receiver() as am, serve(tmp_path / "state.db", 1.0,
                                 ("--notify", am.url + "/api/v2/alerts", "--external-url", "http://laggard.test:8750")
                                 ) as base:
        t0 = time.monotonic()
        prom_proc, prom = _prometheus(tmp_path, base.removeprefix("http://"), am.url.removeprefix("http://"))
        try:
            t = trial(base, tmp_path / "run", JOB, slow_rank=1, slow_from=15, steps=50, slow_ms=60, deadline_s=90,
                      linger_s=3, after_end_s=AFTER_END_S)
            assert t.seconds is not None, (t.named, json.dumps(t.last, default=str)[:3000],
                                           (tmp_path / "state.log").read_text()[-2000:], t.agent_log[-2000:])
            print(f"phases: serve up {t0 - t_start:.1f} s, job and agent {time.monotonic() - t0:.1f} s, "
                  f"verdict {t.seconds:.1f} s after the first slowed step")
            assert t.job_rc == 0 and t.agent_rc == 0, t.agent_log[-2000:]
            deadline = time.monotonic() + 30
            firing: list[dict[str, Any]] = []
            named: list[dict[str, Any]] = []
            while time.monotonic() < deadline and not (firing and named):
                named = _query(prom, f'max_over_time(laggard_candidate_score{{job_name="{JOB}", position="1", '
                                     f'kind="gpu", rank="1"}}[5m])')
                firing = [a for a in _query(prom, 'ALERTS{alertname="LaggardJobIrregular", alertstate="firing"}')
                          if a["metric"].get("job_name") == JOB]
                time.sleep(0.5)
            assert named, "Prometheus never scraped a candidate score for rank 1"
            assert firing, "the shipped LaggardJobIrregular rule did not fire"
            assert _query(prom, f'laggard_job_irregular{{job="laggard", job_name="{JOB}"}}')[0]["value"][1] == "1"
            assert _query(prom, "laggard_build_info") and _query(prom, 'process_resident_memory_bytes{job="laggard"}')
            # the service's own notification: startsAt is the onset, the link is its report page
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not any(p == "/api/v2/alerts" and "generatorURL" in b[0] and
                                                          b[0]["labels"].get("job") == JOB for p, b in am.posts):
                time.sleep(0.3)
            ours = [b[0] for p, b in am.posts if p == "/api/v2/alerts" and b[0].get("generatorURL", "").startswith(
                "http://laggard.test:8750/")]
            assert ours, am.posts
            assert ours[0]["generatorURL"] == f"http://laggard.test:8750/v1/jobs/{JOB}/report"
            started = datetime.fromisoformat(ours[0]["startsAt"].replace("Z", "+00:00")).timestamp()
            records = ds.dataset(tmp_path / "run" / "commops", format="parquet").to_table(columns=["start_ns"])
            job_began = float(np.asarray(records["start_ns"]).min()) / 1e9
            fault = fault_start(tmp_path / "run", 1, 15)
            # the onset (the first irregular step, never after the slowed one), not the time it was sent
            assert job_began <= started <= fault + 1.0, (job_began, started, fault)
            # Prometheus' own alert reached the same receiver
            assert any(p == "/api/v2/alerts" and b[0]["labels"].get("alertname") == "LaggardJobIrregular"
                       and b[0]["labels"].get("job_name") == JOB for p, b in am.posts)
        finally:
            prom_proc.terminate()
            prom_proc.wait(timeout=15)
