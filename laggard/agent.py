"""The node agent: `laggard sidecar run TRACE --follow --post URL` beside a running job.

It waits for the job's ranks on this host to appear in the CommOps logger's directory, then,
every poll, summarizes the steps every local rank has finished (localize/summary.py's
`summarize`, with the previous steps as the detector's history) and posts the summary to
`laggard serve`. A post is written to a bounded on-disk spool before it is sent and removed only
once the service acknowledged it, so a service that is down or restarting loses nothing within
the spool's bound (beyond it the oldest posts are dropped, counted and said so). The service's
replies may ask for full records of some ranks and steps; the agent reads them from its shards
and posts them. It exits once the job has ended (its processes are gone, or no shard changed
for a while) and a last round of fetch requests has been answered.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from collector.commops.layout import (
    PENDING_SCHEMA,
    atomic_write_bytes,
    rank_shards,
    read_rank_infos,
)
from collector.inputs.errors import UserError
from collector.inputs.safeio import read_json
from collector.trace.meta import JobMeta
from laggard.cliutil import emit
from localize.commops import COLUMNS
from localize.summary import groups_within, summarize, to_wire

HISTORY = 20  # earlier steps the detector judges each operator against
TIMEOUT_S = 10.0
MAX_BACKOFF_S = 30.0
WIRE_COLUMNS = ("rank", "step", "group", "abnormal", "abnormal_us", "compute_us", "step_end_us", "step_start_us")
PENDING_COLUMNS = ("rank", "group", "op", "seq", "peer", "nbytes", "start_ns", "step", "seen_ns", "failed")
MAX_PENDING = 64  # stuck operators per post, longest waits first: a hang needs a few, never thousands


@dataclass
class NodeView:
    """What this node knows of the job: its name, world size, its ranks and their groups."""

    job: str
    world_size: int
    ranks: dict[int, dict[str, Any]]  # rank -> {gpu, ip}
    groups: dict[str, list[int]]
    pids: list[int] = field(default_factory=list)


def node_view(root: Path, host: str) -> NodeView | None:
    """The host's ranks from the logger's own files (`ranks/`), else meta.json; None until they appear."""
    infos = read_rank_infos(root)
    mine = {r: i for r, i in infos.items() if str(i.get("host")) == host}
    if mine:
        first = mine[min(mine)]
        groups = {str(g): sorted(int(x) for x in m) for i in mine.values() for g, m in i.get("groups", {}).items()}
        world = max(int(i.get("world_size", 0)) for i in mine.values())
        return NodeView(str(first.get("job", "commops")), max(world, max(mine) + 1),
                        {r: {"gpu": int(i.get("gpu", 0))} for r, i in mine.items()}, groups,
                        [int(i["pid"]) for i in mine.values() if "pid" in i])
    if (root / "meta.json").exists():
        meta = JobMeta.load(root / "meta.json")
        ranks = {r: {"gpu": i.gpu, **({"ip": i.ip} if i.ip else {})} for r, i in meta.ranks.items() if i.host == host}
        if ranks:
            groups = {g: sorted(m) for g, m in meta.groups.items() if set(m) & set(ranks)}
            return NodeView(meta.job, meta.world_size, ranks, groups)
    return None


def wire_group(members: list[int]) -> list[int] | str:
    """A group as 'start:stop:step' when it is arithmetic (Megatron's are), else its list."""
    if len(members) > 2:
        d = np.diff(members)
        if (d == d[0]).all() and d[0] > 0:
            return f"{members[0]}:{members[-1] + 1}:{int(d[0])}"
    return members


class Spool:
    """Posts not yet acknowledged, one file each, oldest first; at most `max_bytes` on disk."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.dropped = 0
        path.mkdir(parents=True, exist_ok=True)

    def put(self, window: int, body: bytes) -> None:
        atomic_write_bytes(self.path / f"{window:012d}.json", body)
        self._bound()

    def items(self) -> list[Path]:
        return sorted(self.path.glob("[0-9]*.json"))

    def _bound(self) -> None:
        files = self.items()
        sizes = [p.stat().st_size for p in files]
        total = sum(sizes)
        i = 0
        while total > self.max_bytes and i < len(files) - 1:  # never the newest
            files[i].unlink(missing_ok=True)
            total -= sizes[i]
            self.dropped += 1
            i += 1
        if i:
            emit(f"laggard agent: spool over {self.max_bytes:,} B while the service is unreachable: dropped the "
                 f"{i} oldest summary(ies) ({self.dropped} so far); raise --spool-max-mb to keep more",
                 file=sys.stderr)


@dataclass
class AgentState:
    next_step: int = 0
    window: int = 0


class Agent:
    def __init__(self, root: Path, host: str, url: str, spool: Path, spool_max: int, window: int,
                 client: httpx.Client | None = None, sleep: Callable[[float], None] = time.sleep,
                 hang_after_s: float = 30.0) -> None:
        self.root, self.host, self.url = root, host, url.rstrip("/")
        self.spool = Spool(spool, spool_max)
        self.window = window
        self.hang_after_s = hang_after_s
        self.client = client or httpx.Client(timeout=TIMEOUT_S)
        self.sleep = sleep
        self.view: NodeView | None = None
        self.state_path = spool / "state.json"
        raw = read_json(self.state_path) if self.state_path.exists() else {}
        self.state = AgentState(int(raw.get("next_step", 0)), int(raw.get("window", 0)))
        self.backoff = 0.0
        self.retry_at = 0.0
        self.posted = 0
        self.answered = 0
        self.refused = 0
        self._max_step: dict[Path, int] = {}
        self.was_stuck = False

    # -- reading the node's shards ----------------------------------------------------------

    def _read(self, ranks: list[int], lo: int, hi: int | None = None) -> pd.DataFrame:
        """Rows of `ranks` with step >= lo (and <= hi); shards wholly before `lo` are skipped."""
        files = []
        for p in rank_shards(self.root, ranks):
            top = self._max_step.get(p)
            if top is None:
                steps = pq.read_table(p, columns=["step"])["step"]
                top = int(max(steps.to_numpy(), default=-1)) if len(steps) else -1
                self._max_step[p] = top
            if top >= lo:
                files.append(p)
        if not files:
            return pd.DataFrame(columns=COLUMNS)
        expr = ds.field("step") >= lo
        if hi is not None:
            expr = expr & (ds.field("step") <= hi)
        return ds.dataset(files, format="parquet").to_table(columns=list(COLUMNS), filter=expr).to_pandas()

    def summarize_new(self, final: bool) -> list[tuple[int, bytes]]:
        """Posts for the steps every local rank finished since the last post (all of them when `final`)."""
        view = self.view
        assert view is not None
        ranks = sorted(view.ranks)
        lo = self.state.next_step
        df = self._read(ranks, max(0, lo - HISTORY))
        df = df[df["step"] >= 0]
        if df.empty:
            return []
        last = df.groupby("rank")["step"].max()
        done = int(df["step"].max()) if final else (int(last.min()) - 1 if len(last) == len(ranks) else lo - 1)
        posts = []
        for first in range(lo, done + 1, self.window):
            end = min(first + self.window - 1, done)
            part = df[(df["step"] >= first - HISTORY) & (df["step"] <= end)].reset_index(drop=True)
            s = summarize(part, lambda _r: self.host, groups_within(view.groups, ranks))
            s = s[(s["step"] >= first) & (s["step"] <= end)]
            wire = to_wire(s)
            body = {"job": view.job, "node": self.host, "window": self.state.window, "first_step": first,
                    "last_step": end, "world_size": view.world_size,
                    "ranks": {str(r): v for r, v in sorted(view.ranks.items())},
                    "groups": {g: wire_group(m) for g, m in sorted(view.groups.items())},
                    "rows": {c: wire[c].tolist() for c in WIRE_COLUMNS}, "dropped": self.spool.dropped}
            posts.append((self.state.window, json.dumps(body, separators=(",", ":")).encode()))
            self.state = AgentState(end + 1, self.state.window + 1)
        return posts

    def stuck(self) -> dict[str, list[Any]]:
        """This node's operators entered and not completed for `hang_after_s` (or failed), from the
        logger's pending/ files: the longest waits first, at most MAX_PENDING."""
        view = self.view
        assert view is not None
        parts = []
        for r in sorted(view.ranks):
            p = self.root / "pending" / f"rank-{r:05d}.parquet"
            try:
                parts.append(pq.read_table(p, schema=PENDING_SCHEMA).to_pandas())
            except (OSError, ValueError):  # none, or replaced while read: the next poll sees it
                continue
        if not parts:
            return {c: [] for c in PENDING_COLUMNS}
        df = pd.concat(parts, ignore_index=True)
        wait = df["seen_ns"] - df["start_ns"]
        df = df[(df["failed"] | (wait >= self.hang_after_s * 1e9)) & df["rank"].isin(list(view.ranks))]
        df = df.loc[(df["seen_ns"] - df["start_ns"]).sort_values(ascending=False).index[:MAX_PENDING]]
        return {c: df[c].tolist() for c in PENDING_COLUMNS}

    def pending_post(self, stuck: dict[str, list[Any]]) -> tuple[int, bytes]:
        """A post of no new steps carrying the stuck operators (a hung job finishes no steps)."""
        view = self.view
        assert view is not None
        last, window = max(self.state.next_step - 1, 0), self.state.window
        body = {"job": view.job, "node": self.host, "window": window, "first_step": last,
                "last_step": last, "world_size": view.world_size,
                "ranks": {str(r): v for r, v in sorted(view.ranks.items())},
                "rows": {c: [] for c in WIRE_COLUMNS}, "pending": stuck, "dropped": self.spool.dropped}
        self.state = AgentState(self.state.next_step, self.state.window + 1)
        return window, json.dumps(body, separators=(",", ":")).encode()

    def records(self, ranks: list[int], steps: list[int]) -> dict[str, list[Any]]:
        mine = sorted(set(ranks) & set(self.view.ranks if self.view else {}))
        if not mine or not steps:
            return {c: [] for c in COLUMNS}
        df = self._read(mine, min(steps), max(steps))
        df = df[df["step"].isin(steps) & df["rank"].isin(mine)]
        return {c: df[c].tolist() for c in COLUMNS}

    # -- talking to the service -------------------------------------------------------------

    def _post(self, path: str, body: bytes) -> httpx.Response | None:
        """One POST; None when the service could not be reached or failed (5xx, 429): retry later."""
        try:
            r = self.client.post(self.url + path, content=body, headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            self._fail(f"{type(exc).__name__}: {exc}")
            return None
        if r.status_code >= 500 or r.status_code == 429:
            self._fail(f"HTTP {r.status_code}")
            return None
        self.backoff = 0.0
        return r

    def _fail(self, why: str) -> None:
        self.backoff = min(MAX_BACKOFF_S, max(1.0, self.backoff * 2))
        self.retry_at = time.monotonic() + self.backoff * (0.5 + random.random())
        emit(f"laggard agent: {self.url} unreachable ({why}); {len(self.spool.items())} summary(ies) spooled, "
             f"retrying in about {self.backoff:.0f} s", file=sys.stderr)

    def flush(self) -> None:
        """Send the spool oldest first; stop at the first failure (and wait out the backoff)."""
        if time.monotonic() < self.retry_at:
            return
        for p in self.spool.items():
            r = self._post("/v1/summaries", p.read_bytes())
            if r is None:
                return
            if r.status_code >= 300:
                self.refused += 1
                emit(f"laggard agent: the service refused {p.name}: HTTP {r.status_code} {r.text[:300]}; dropped",
                     file=sys.stderr)
            else:
                self.posted += 1
                self._answer(r.json().get("fetch"))
            p.unlink(missing_ok=True)

    def poll_fetch(self) -> None:
        if self.view is None or time.monotonic() < self.retry_at:
            return
        try:
            r = self.client.get(f"{self.url}/v1/jobs/{self.view.job}/fetch", params={"node": self.host})
        except httpx.HTTPError as exc:
            self._fail(f"{type(exc).__name__}: {exc}")
            return
        if r.status_code == 200:
            self._answer(r.json())

    def _answer(self, req: dict[str, Any] | None) -> None:
        if not req or self.view is None:
            return
        body = {"job": self.view.job, "node": self.host, "request": int(req["request"]),
                "rows": self.records([int(x) for x in req["ranks"]], [int(x) for x in req["steps"]])}
        r = self._post("/v1/records", json.dumps(body, separators=(",", ":")).encode())
        if r is not None and r.status_code < 300:
            self.answered += 1
        elif r is not None and r.status_code != 409:  # 409: the request was replaced meanwhile
            emit(f"laggard agent: records refused: HTTP {r.status_code} {r.text[:300]}", file=sys.stderr)

    # -- the loop -----------------------------------------------------------------------------

    def step(self, final: bool = False, ended: bool = False) -> None:
        """Summarize what is new, spool it, send the spool, look for fetch requests. Stuck operators
        ride on the newest post, or on a post of their own when no step finished (a hang); so does
        `ended` (the ranks exited), which lets the service answer without waiting for quiet."""
        posts = self.summarize_new(final)
        stuck = self.stuck()
        if posts:
            window, raw = posts[-1]
            body = json.loads(raw)
            body["pending"] = stuck
            posts[-1] = (window, json.dumps(body, separators=(",", ":")).encode())
        elif stuck["rank"] or self.was_stuck or ended:  # a cleared hang is said once more, so the service sees it
            posts = [self.pending_post(stuck)]
        if ended:
            window, raw = posts[-1]
            posts[-1] = (window, json.dumps({**json.loads(raw), "ended": True}, separators=(",", ":")).encode())
        self.was_stuck = bool(stuck["rank"])
        for window, body in posts:
            self.spool.put(window, body)
        atomic_write_bytes(self.state_path, json.dumps(self.state.__dict__).encode())
        pending = bool(self.spool.items())
        self.flush()
        if not pending:
            self.poll_fetch()

    def job_alive(self) -> bool | None:
        """False once every local rank's process is gone (None: cannot tell from here)."""
        if self.view is None or not self.view.pids or not Path("/proc").is_dir():
            return None
        return any(Path(f"/proc/{p}").exists() for p in self.view.pids)

    def run(self, poll_s: float, wait_s: float, idle_exit_s: float, linger_s: float) -> int:
        t0 = time.monotonic()
        while (view := node_view(self.root, self.host)) is None:
            if time.monotonic() - t0 > wait_s:
                raise UserError(f"{self.root}: no ranks of host {self.host} appeared within {wait_s:.0f} s",
                                "check the job's LAGGARD_COMMOPS_DIR and --host (ranks name their host "
                                "by `hostname`)")
            self.sleep(poll_s)
        self.view = view
        emit(f"laggard agent: job {view.job}, ranks {sorted(view.ranks)} on {self.host}; posting to {self.url}",
             file=sys.stderr)
        seen, idle = -1, 0.0
        while True:
            refreshed = node_view(self.root, self.host)
            if refreshed is not None:
                self.view = refreshed
            self.step()
            files = list((self.root / "commops").glob("rank-*.parquet")) + list((self.root / "ranks").glob("*.json"))
            mark = sum(p.stat().st_mtime_ns for p in files) + len(files)
            idle = idle + poll_s if mark == seen else 0.0
            seen = mark
            alive = self.job_alive()
            # the ranks' processes say when the job ended; only where they cannot be seen (another
            # PID namespace) does a long silence of the logger's files stand in for it
            if alive is False or (alive is None and idle >= idle_exit_s):
                break
            self.sleep(poll_s)
        self.step(final=True, ended=alive is False)
        end = time.monotonic() + linger_s  # answer the service's last fetch requests
        while time.monotonic() < end:
            self.sleep(poll_s)
            self.flush()
            self.poll_fetch()
        if self.spool.items():
            emit(f"laggard agent: {len(self.spool.items())} summary(ies) left unsent in {self.spool.path}; "
                 "they are sent when the agent runs again", file=sys.stderr)
        return self.posted


def default_spool(root: Path, host: str) -> Path:
    return Path(os.environ.get("LAGGARD_SPOOL", root / "spool" / host))
