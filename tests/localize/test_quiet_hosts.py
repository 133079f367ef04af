"""A host that logged nothing (no logger ran there): its GPUs' delay shows only as its peers'
collectives short of its copies, in which every logged copy waited. Those waits are its; its
compute and its NIC look alike from its peers' records, so the two are said as a tie, on both
paths, rather than blame falling on whichever logged rank the delay reached first."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.altgen import Fault, Layout, unlogged_hosts
from tests.localize.altgen_jobs import altgen_job, both_paths, written


@pytest.mark.parametrize("kind", ["host", "nic"])
def test_a_slow_host_that_logged_nothing_is_named_with_its_nic(tmp_path: Path, kind: str) -> None:
    lay = Layout(tp=4, pp=2, dp=8, gpus_per_host=4, hosts_per_switch=4, order="tp-dp-pp")  # a TP group per host
    spec = altgen_job("quiet", lay, Fault(kind, 2.0, "persistent", list(range(8, 16))), steps=16, seed=5,
                      logging="hosts75")
    quiet = sorted(int(h) for h in unlogged_hosts(spec))
    spec.fault.host = quiet[0]  # type: ignore[union-attr]
    for v in both_paths(written(spec, tmp_path), top=10):
        top = {c.device() for c in v.candidates if c.score == v.candidates[0].score}
        # its data-parallel rings also miss the GPUs of another quiet host (12, 13 here): in those
        # both were waited on alike, and no record says which; the tie holds quiet hosts only
        assert {f"host node-{quiet[0]}", f"nic node-{quiet[0]}"} <= top, (v.status, top)
        assert top <= {f"{k} node-{h}" for h in quiet for k in ("host", "nic")} and len(top) <= 4, top
        assert "logged nothing" in v.candidates[0].evidence[0]


def test_two_hosts_that_logged_nothing_and_share_a_tp_group_are_one_tie(tmp_path: Path) -> None:
    """TP 8 over two hosts of 4 GPUs, neither of which logged: slow, either holds up the other."""
    lay = Layout(tp=8, pp=2, dp=4, gpus_per_host=4, hosts_per_switch=4, order="tp-dp-pp")
    spec = altgen_job("quiet-pair", lay, Fault("host", 2.0, "persistent", list(range(8, 16))), steps=16, seed=5,
                      logging="hosts75")
    quiet = sorted(int(h) for h in unlogged_hosts(spec))
    assert quiet[:2] == [6, 7]  # (this seed's: the pair of TP group 24-31)
    spec.fault.host = 6  # type: ignore[union-attr]
    for v in both_paths(written(spec, tmp_path), top=10):
        top = sorted(c.device() for c in v.candidates if c.score == v.candidates[0].score)
        assert top == ["host node-6", "host node-7", "nic node-6", "nic node-7"], (v.status, top)
