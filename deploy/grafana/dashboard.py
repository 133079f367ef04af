"""The Grafana dashboard for `laggard serve`, built with grafanalib; writes laggard.json beside it.

    python deploy/grafana/dashboard.py        # regenerate after editing (tests/deploy checks it)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafanalib._gen import DashboardEncoder
from grafanalib.core import (
    Dashboard,
    GridPos,
    Stat,
    Table,
    Template,
    Templating,
    TimeSeries,
)
from grafanalib.core import Target as GTarget

DS = "${datasource}"
JOB = 'job_name=~"$job_name"'


def target(expr: str, legend: str = "", instant: bool = False) -> GTarget:
    return GTarget(expr=expr, legendFormat=legend, refId="A", datasource=DS, instant=instant)


def dashboard() -> Dashboard:
    return Dashboard(
        title="laggard: slow and stuck training jobs",
        uid="laggard-jobs",
        description="Irregular jobs, their root-cause candidates, time lost, and the service's own health.",
        tags=["laggard", "training"],
        timezone="utc",
        refresh="30s",
        templating=Templating([
            Template(name="datasource", type="datasource", query="prometheus", label="Prometheus"),
            Template(name="job_name", label="Job", dataSource=DS, includeAll=True, multi=True,
                     query="label_values(laggard_job_irregular, job_name)", refresh=2),
        ]),
        panels=[
            Stat(title="Irregular jobs", gridPos=GridPos(h=4, w=6, x=0, y=0), dataSource=DS,
                 targets=[target(f"sum(laggard_job_irregular{{{JOB}}})")]),
            Stat(title="Stuck jobs", gridPos=GridPos(h=4, w=6, x=6, y=0), dataSource=DS,
                 targets=[target(f"sum(laggard_job_hang{{{JOB}}})")]),
            Stat(title="GPU-hours lost (24 h)", gridPos=GridPos(h=4, w=6, x=12, y=0), dataSource=DS, decimals=1,
                 targets=[target(f"sum(increase(laggard_job_lost_gpu_seconds_total{{{JOB}}}[24h])) / 3600")]),
            Stat(title="Jobs failing to localize", gridPos=GridPos(h=4, w=6, x=18, y=0), dataSource=DS,
                 targets=[target(f"sum(laggard_job_localization_failed{{{JOB}}})")]),
            Table(title="Root-cause candidates (best first)", gridPos=GridPos(h=8, w=24, x=0, y=4), dataSource=DS,
                  targets=[target(f"laggard_candidate_score{{{JOB}}}", instant=True)]),
            TimeSeries(title="Slowdown (irregular step time / baseline)", gridPos=GridPos(h=8, w=12, x=0, y=12),
                       dataSource=DS, targets=[target(f"laggard_job_slowdown_ratio{{{JOB}}}", "{{job_name}}")]),
            TimeSeries(title="GPU-seconds lost per second", gridPos=GridPos(h=8, w=12, x=12, y=12), dataSource=DS,
                       targets=[target(f"sum by (job_name) (rate(laggard_job_lost_gpu_seconds_total{{{JOB}}}[5m]))",
                                       "{{job_name}}")]),
            TimeSeries(title="Ingest latency p99", gridPos=GridPos(h=8, w=8, x=0, y=20), dataSource=DS, unit="s",
                       targets=[target("histogram_quantile(0.99, sum by (le, kind) "
                                       "(rate(laggard_ingest_duration_seconds_bucket[5m])))", "{{kind}}")]),
            TimeSeries(title="Localization time p90", gridPos=GridPos(h=8, w=8, x=8, y=20), dataSource=DS, unit="s",
                       targets=[target("histogram_quantile(0.9, sum by (le) "
                                       "(rate(laggard_localization_duration_seconds_bucket[5m])))", "p90")]),
            TimeSeries(title="Posts stored and refused", gridPos=GridPos(h=8, w=8, x=16, y=20), dataSource=DS,
                       targets=[target(f"sum(rate(laggard_summaries_received_total{{{JOB}}}[5m]))", "stored"),
                                target("sum by (reason) (rate(laggard_posts_rejected_total[5m]))", "refused: {{reason}}")]),
        ],
    ).auto_panel_ids()


def render() -> str:
    return json.dumps(dashboard().to_json_data(), cls=DashboardEncoder, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    out = Path(__file__).with_name("laggard.json")
    out.write_text(render())
    print(f"wrote {out}", file=sys.stderr)
