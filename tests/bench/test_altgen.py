"""The independent generator writes traces laggard's validator accepts, with a truth that says what was injected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from bench.altgen import (
    Costs,
    Fault,
    JobSpec,
    Layout,
    Net,
    compute_factor,
    random_spec,
    schedule_order,
    simulate,
    stage_program,
    write_trace,
)
from collector.trace.validate import validate_trace


def tiny_job(fault: Fault | None, p2p: str = "rendezvous", logging: str = "all", ep: int = 1) -> JobSpec:
    lay = Layout(tp=2, pp=2, dp=4, gpus_per_host=4, hosts_per_switch=2, order="tp-dp-pp", ep=ep)
    costs = Costs(fwd_chunk_s=2e-3, tp_bytes=16 << 20, act_bytes=16 << 20, grad_bytes=1 << 30, nvlink_Bps=3e11,
                  net_Bps=2.5e10, latency_s=2e-5, compute_sigma=0.03, net_sigma=0.05, optimizer_s=5e-3,
                  a2a_bytes=8 << 20)
    return JobSpec(name="tiny", layout=lay, microbatches=4, steps=12, p2p=p2p, dp_mode="all_reduce", step_sync="mp",
                   logging=logging, step0=1000, naming="megatron", meta_groups=True, meta_parallelism=False,
                   warmup_steps=1, warmup_factor=1.5, costs=costs, fault=fault, kind=fault.kind if fault else "healthy",
                   seed=3, logged=list(range(12)))


@pytest.mark.parametrize("p2p", ["rendezvous", "batched", "eager"])
def test_trace_validates_and_truth_names_the_injected_nic(tmp_path: Path, p2p: str) -> None:
    spec = tiny_job(Fault("nic", 2.5, "persistent", list(range(6, 12)), host=2), p2p=p2p)
    rows, step_time = simulate(spec)
    truth = write_trace(spec, tmp_path, rows, step_time)
    assert [p.line() for p in validate_trace(tmp_path)] == []
    assert truth == json.loads((tmp_path / "truth.json").read_text())
    (f,) = truth["faults"]
    assert (f["kind"], f["host"], f["magnitude"]) == ("nic", "node-2", 2.5)
    assert f["active_steps"] == list(range(1006, 1012))
    assert step_time[6:].mean() > 1.1 * step_time[1:6].mean()


def test_eager_sends_end_alone_and_rendezvous_sends_wait_for_their_receiver(tmp_path: Path) -> None:
    """What an H200 measured of NCCL (bench.p2p_semantics): up to 8 MiB a send completes alone;
    larger ones wait for their receiver. A late receiver shows in the send's row only under rendezvous."""
    def p2p_rows(p2p: str) -> Any:
        spec = tiny_job(Fault("gpu", 3.0, "persistent", list(range(6, 12)), rank=12), p2p=p2p)
        rows, step_time = simulate(spec)
        write_trace(spec, tmp_path / p2p, rows, step_time)
        t = pq.read_table(tmp_path / p2p / "commops.parquet").to_pandas()
        t["dur"] = t["end_ns"] - t["start_ns"]
        return t[t["op"] == "send"]["dur"], t[t["op"] == "recv"]["dur"]

    eager_send, eager_recv = p2p_rows("eager")
    rdv_send, _ = p2p_rows("rendezvous")
    assert eager_send.max() <= 1.01 * 2e-5 * 1e9  # the latency alone
    assert eager_recv.max() > 100 * eager_send.max()  # the data waited for, or waiting
    assert rdv_send.max() > 100 * eager_send.max()  # a send held until its (slow) receiver posted


def test_tp0_logging_keeps_only_the_first_rank_of_each_tp_group(tmp_path: Path) -> None:
    spec = tiny_job(Fault("gpu", 2.0, "spike", [5, 6], rank=5), logging="tp0")
    rows, step_time = simulate(spec)
    truth = write_trace(spec, tmp_path, rows, step_time)
    assert validate_trace(tmp_path) == []
    logged = set(pq.read_table(tmp_path / "commops.parquet").column("rank").to_pylist())
    assert logged == set(range(0, 16, 2))
    assert (truth["faults"][0]["rank"], truth["faults"][0]["start_step"]) == (5, 1005)


def test_hosts75_logging_leaves_a_quarter_of_the_hosts_without_records(tmp_path: Path) -> None:
    spec = tiny_job(Fault("gpu", 2.0, "persistent", list(range(6, 12)), rank=5), logging="hosts75")
    rows, step_time = simulate(spec)
    truth = write_trace(spec, tmp_path, rows, step_time)
    assert validate_trace(tmp_path) == []
    hosts = {r // 4 for r in pq.read_table(tmp_path / "commops.parquet").column("rank").to_pylist()}
    assert len(hosts) == 3 and truth["unlogged_rank"] == (1 not in hosts)
    assert len(json.loads((tmp_path / "meta.json").read_text())["ranks"]) == 16  # the launcher knows every rank


@pytest.mark.parametrize(("pp", "m"), [(2, 1), (4, 4), (4, 8), (8, 4)])
def test_1f1b_runs_every_microbatch_forward_and_backward_once_without_deadlock(pp: int, m: int) -> None:
    progs = [stage_program(s, pp, m) for s in range(pp)]
    assert len(schedule_order(progs)) == sum(len(p) for p in progs)
    for prog in progs:
        computes = [it[1:] for it in prog if it[0] == "C"]
        assert sorted(computes) == sorted([("F", j) for j in range(m)] + [("B", j) for j in range(m)])


def test_a_healthy_job_has_no_fault_and_steady_steps(tmp_path: Path) -> None:
    spec = tiny_job(None)
    rows, step_time = simulate(spec)
    truth = write_trace(spec, tmp_path, rows, step_time)
    assert truth["faults"] == []
    assert np.ptp(step_time[1:]) < 0.2 * np.median(step_time[1:])


def test_a_data_fault_slows_one_whole_replica_per_step_and_moves_between_replicas() -> None:
    spec = tiny_job(Fault("data", 1.5, "persistent", list(range(2, 12))))
    rng = np.random.default_rng(0)
    replicas = spec.layout.ranks().transpose(1, 0, 2).reshape(spec.layout.dp, -1)
    hit = []
    for step in range(2, 12):
        slow = set(np.flatnonzero(compute_factor(spec, step, rng) > 1).tolist())
        (d,) = [d for d in range(spec.layout.dp) if set(replicas[d].tolist()) == slow]
        hit.append(d)
    assert len(set(hit)) > 1
    assert not (compute_factor(spec, 0, rng) > 1).any()


@pytest.mark.parametrize(("scope", "inside_rack_slow"), [("uplink", False), ("whole", True)])
def test_a_switch_fault_slows_traffic_leaving_its_rack_and_inside_it_only_when_whole(
        scope: str, inside_rack_slow: bool) -> None:
    spec = tiny_job(Fault("switch", 3.0, "persistent", [5], switch=0, scope=scope))
    net, healthy = Net(spec, 5, 1.0), Net(spec, 4, 1.0)
    a, b = np.array([0, 0, 2]), np.array([1, 2, 3])  # hosts 0-1 share tor-0, hosts 2-3 share tor-1
    slow = net.inv_bw(a, b) > healthy.inv_bw(a, b)
    assert slow.tolist() == [inside_rack_slow, True, False]


def test_expert_parallel_groups_exchange_tokens_with_all_to_all(tmp_path: Path) -> None:
    spec = tiny_job(Fault("nic", 3.0, "persistent", list(range(6, 12)), host=1), ep=2)
    rows, step_time = simulate(spec)
    write_trace(spec, tmp_path, rows, step_time)
    assert validate_trace(tmp_path) == []
    meta = json.loads((tmp_path / "meta.json").read_text())
    experts = [g for name, g in meta["groups"].items() if name.startswith("expert_model_parallel_")]
    assert sorted(map(sorted, experts)) == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    table = pq.read_table(tmp_path / "commops.parquet").to_pandas()
    a2a = table[table.op == "all_to_all"]
    assert len(a2a) == 16 * 4 * spec.microbatches * spec.steps
    assert step_time[6:].mean() > 1.1 * step_time[1:6].mean()


def test_megatron_logging_keeps_one_rank_per_tp_group_in_sampled_steps(tmp_path: Path) -> None:
    spec = random_spec(3, "gpu", seed=11, force={"logging": "tp0-random40", "tp": "4"})
    rows, step_time = simulate(spec)
    write_trace(spec, tmp_path, rows, step_time)
    assert validate_trace(tmp_path) == []
    table = pq.read_table(tmp_path / "commops.parquet")
    assert {r % 4 for r in set(table.column("rank").to_pylist())} == {0}
    assert 0 < len(spec.logged) < 0.7 * spec.steps


def written(spec: JobSpec, out: Path, **variant: str) -> tuple[Any, np.ndarray]:
    """`spec` with `variant` pinned, simulated and written to `out`: its rows as a frame, validated,
    and its step times."""
    for key, value in variant.items():
        setattr(spec, key, value)
    rows, step_time = simulate(spec)
    write_trace(spec, out, rows, step_time)
    assert validate_trace(out) == []
    return pq.read_table(out / "commops.parquet").to_pandas(), step_time


def test_sequence_parallel_tp_groups_gather_and_reduce_scatter_instead_of_all_reducing(tmp_path: Path) -> None:
    """Each block's all-reduce becomes an all-gather before it and a reduce-scatter after (Megatron's
    --sequence-parallel), and the compute between them is what a slow GPU stretches."""
    spec = tiny_job(Fault("gpu", 2.0, "persistent", list(range(6, 12)), rank=5))
    table, step_time = written(spec, tmp_path, tp_comm="sp")
    tp = table[table.group.str.startswith("tensor_model_parallel")]
    per_kind = tp.groupby("op").size().to_dict()
    per_rank = 4 * spec.microbatches * spec.steps  # (two blocks a chunk, a forward and a backward chunk a microbatch)
    assert per_kind == {"all_gather": 16 * per_rank, "reduce_scatter": 16 * per_rank}
    assert step_time[6:].mean() > 1.2 * step_time[1:6].mean()


@pytest.mark.parametrize("tp_comm", ["all_reduce", "sp"])
def test_each_group_numbers_its_collectives_without_gaps(tmp_path: Path, tp_comm: str) -> None:
    """A group's collectives are numbered one after another on every rank, as NCCL and the
    CommOps logger number them: a gap reads as lost records, and compute across one is never blamed."""
    table, _ = written(tiny_job(None, ep=2), tmp_path, tp_comm=tp_comm)
    coll = table[~table.op.isin(["send", "recv"])].sort_values(["rank", "group", "start_ns"])
    gaps = coll.groupby(["rank", "group"])["seq"].diff().dropna()
    assert (gaps == 1).all(), gaps.value_counts().to_dict()


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 4), (4, 8)])
def test_interleaved_chunks_pass_activations_from_the_last_stage_to_the_first(pp: int, m: int) -> None:
    """Two model chunks a stage: every microbatch runs forward and backward through all 2 x pp
    virtual stages, the last stage's first chunk handing on to the first stage's second."""
    progs = [stage_program(s, pp, m, "interleaved") for s in range(pp)]
    assert len(schedule_order(progs)) == sum(len(p) for p in progs)
    assert all(sum(1 for it in p if it[0] == "C") == 2 * 2 * m for p in progs)
    wraps = [op for it in progs[pp - 1] if it[0] == "P" for op in it[1] if op[0] == "send" and op[1] == "fwd"]
    assert len(wraps) == m  # its first chunk's activations, to stage 0's second chunk


def test_an_interleaved_job_names_the_wrapped_pipeline_in_its_trace(tmp_path: Path) -> None:
    table, step_time = written(tiny_job(Fault("gpu", 2.0, "persistent", list(range(6, 12)), rank=5)), tmp_path,
                               schedule="interleaved")
    sends = table[table.op == "send"]
    stage = {r: r // (2 * 4) for r in range(16)}  # (tiny_job's order: tp, dp, then pp)
    assert any(stage[int(a)] == 1 and stage[int(b)] == 0 for a, b in zip(sends["rank"], sends["peer"], strict=True))
    assert step_time[6:].mean() > 1.2 * step_time[1:6].mean()
