"""Settings real fleets vary: switch sizes, clock offsets, which ranks log, which steps are written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collector.inputs.errors import UserError
from collector.trace.traceio import Trace
from simulator.config import FaultSpec, SimConfig
from simulator.writer import simulate_trace


@pytest.mark.parametrize("hps", [4, 8, 16, 32])
def test_switch_sizes_put_hosts_under_the_right_switch(tmp_path: Path, hps: int) -> None:
    hosts = 64
    cfg = SimConfig(gpus=hosts * 2, gpus_per_host=2, tp=2, steps=2, seed=hps, hosts_per_switch=hps,
                    faults=[FaultSpec.parse(f"switch:switch=tor-{hosts // hps - 1},factor=3")])
    truth = simulate_trace(cfg, tmp_path / "t")
    topo = Trace.open(tmp_path / "t").meta.topology
    switches = {t["switch"] for t in topo.values()}
    assert len(switches) == hosts // hps
    assert all(topo[f"node-{h}"]["switch"] == f"tor-{h // hps}" for h in range(hosts))
    assert truth["faults"][0]["root"] == {"kind": "switch", "switch": f"tor-{hosts // hps - 1}"}
    with pytest.raises(UserError, match="switch"):
        simulate_trace(SimConfig(gpus=hosts * 2, gpus_per_host=2, hosts_per_switch=hps, steps=1,
                                 faults=[FaultSpec.parse(f"switch:switch=tor-{hosts // hps},factor=3")]), tmp_path / "x")


def test_clock_offsets_up_to_100_ms(tmp_path: Path) -> None:
    truth = simulate_trace(SimConfig(gpus=128, tp=8, steps=2, seed=7, clock_skew_ms=100), tmp_path / "t")
    off = np.array(list(truth["clock_offsets_ns"].values())) / 1e6
    assert np.abs(off).max() <= 100 and np.ptp(off) > 100  # 16 hosts spread over most of +-100 ms
    df = Trace.open(tmp_path / "t").commops()
    assert (df["end_ns"] >= df["start_ns"]).all()
    for bad in (-1.0, 1e6):
        with pytest.raises(UserError, match="clock-skew"):
            SimConfig(gpus=8, clock_skew_ms=bad).resolved()


def test_one_rank_per_tp_group_logged(tmp_path: Path, cli) -> None:
    ok = cli("simulate", "--gpus", "64", "--tp", "4", "--pp", "4", "--steps", "3", "--logged-ranks", "one-per-tp",
             "--fault", "gpu:rank=5,factor=2", "--out", tmp_path / "t")
    assert ok.returncode == 0, ok.stderr
    assert cli("validate", tmp_path / "t").returncode == 0
    trace = Trace.open(tmp_path / "t")
    df = trace.commops()
    assert sorted(df["rank"].unique()) == list(range(0, 64, 4))
    assert len(trace.meta.ranks) == 64  # the job still has every rank; only the logger is sparse
    truth = json.loads((tmp_path / "t" / "truth.json").read_text())
    assert truth["logged_ranks"] == "one-per-tp" and truth["logged_rank_count"] == 16
    # the slow rank 5 is not logged: its TP peer rank 4 waits for it in every tensor-parallel all_reduce
    tp = df[df["group"] == "tp-1"]
    assert ((tp["end_ns"] - tp["start_ns"]) / 1e6).median() > 1.0
    # p2p between logged ranks still pairs up
    sends = df[df["op"] == "send"]
    assert sends["peer"].isin(df["rank"].unique()).all()


@pytest.mark.parametrize("sample, expect", [(3, None), (0.25, 5)])
def test_sampled_steps_are_never_consecutive(tmp_path: Path, cli, sample: float, expect: int | None) -> None:
    out = tmp_path / str(sample)
    ok = cli("simulate", "--gpus", "16", "--tp", "4", "--pp", "2", "--steps", "20", "--sample-steps", str(sample),
             "--fault", "gpu:rank=3,factor=3,steps=8:19", "--out", out)
    assert ok.returncode == 0, ok.stderr
    assert cli("validate", out).returncode == 0
    truth = json.loads((out / "truth.json").read_text())
    logged = truth["logged_steps"]
    written = sorted(Trace.open(out).commops(columns=["step"])["step"].unique())
    assert written == logged
    assert np.diff(logged).min() >= 2
    if expect is None:
        assert len(set(np.diff(logged))) == 1 and np.diff(logged)[0] == 3
    else:
        assert len(logged) == expect
    assert truth["irregular_steps"] and set(truth["irregular_steps"]) <= set(logged)
    assert min(truth["irregular_steps"]) >= 8


def test_bad_sampling_and_logged_ranks_are_user_errors(tmp_path: Path, cli) -> None:
    for flags in (["--sample-steps", "0.7"], ["--sample-steps", "2.5"], ["--sample-steps", "-1"], ["--logged-ranks", "some"]):
        bad = cli("simulate", "--gpus", "8", *flags, "--out", tmp_path / "x")
        assert bad.returncode == 2 and "Traceback" not in bad.stderr, flags


@pytest.mark.parametrize("factor", ["inf", "nan", "1e400", "1e6", "0", "-2"])
def test_a_fault_factor_outside_a_finite_slowdown_is_a_user_error(factor: str) -> None:
    with pytest.raises(UserError, match="factor must be a finite number in"):
        FaultSpec.parse(f"gpu:rank=1,factor={factor}")


@pytest.mark.parametrize("gpus, steps, what", [(1 << 30, 20, "rank limit"), (16, 10**8, "step-rank cells")])
def test_a_job_too_large_to_analyse_is_refused_before_anything_is_built(gpus: int, steps: int, what: str) -> None:
    with pytest.raises(UserError, match=what):
        SimConfig(gpus=gpus, tp=8, steps=steps).resolved()


@pytest.mark.parametrize("kw", [{"microbatches": 10**8}, {"pp": 2, "microbatches": 4, "virtual_stages": 10**8}])
def test_a_schedule_too_large_to_write_is_refused_before_anything_is_built(kw: dict[str, Any]) -> None:
    with pytest.raises(UserError, match="operator rows, over"):
        SimConfig(gpus=16, tp=4, steps=10, **kw).resolved()
