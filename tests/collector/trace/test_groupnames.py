"""Process-group names: one name per group whatever the framework's descriptions, and the kind a name says."""

from __future__ import annotations

import pytest

from collector.importers.flight_recorder import group_name
from collector.trace.groupnames import group_label, kind_in_name


def test_a_description_of_one_group_is_its_name() -> None:
    assert group_label("5", "tp-0") == "tp-0"
    assert group_label("9", "dp-13") == "dp-13"


@pytest.mark.parametrize("desc", ["TENSOR_MODEL_PARALLEL_GROUP", "mesh_tp", "mesh_dim_0", "tp"])
def test_a_description_every_group_of_a_kind_shares_is_qualified_per_group(desc: str) -> None:
    """Megatron gives every TP group 'TENSOR_MODEL_PARALLEL_GROUP', DeviceMesh every group of a
    dimension 'mesh_<dim>': named by it alone, the groups of one kind would be one group."""
    names = {group_label(str(n), desc) for n in (3, 4, 5)}
    assert len(names) == 3 and all(n.startswith(desc) for n in names)


def test_the_default_group_and_undescribed_groups() -> None:
    assert group_label("0", "undefined") == "world" == group_label("7", "default_pg")
    assert group_label("12", "undefined") == "pg-12" == group_label("12", "")


def test_flight_recorder_dumps_name_groups_by_the_same_rule() -> None:
    assert group_name(("38", "TENSOR_MODEL_PARALLEL_GROUP")) == group_label("38", "TENSOR_MODEL_PARALLEL_GROUP")
    assert group_name(("38", "TENSOR_MODEL_PARALLEL_GROUP")) != group_name(("39", "TENSOR_MODEL_PARALLEL_GROUP"))
    assert group_name("17") == "pg-17"


@pytest.mark.parametrize(("name", "kind"), [
    ("tp-3", "tp"), ("dp_0", "dp"), ("PP-1", "pp"), ("cp2", "cp"), ("mesh_tp-pg5", "tp"), ("mesh_dp_shard-pg2", "dp"),
    ("TENSOR_MODEL_PARALLEL_GROUP-pg38", "tp"), ("PIPELINE_MODEL_PARALLEL_GROUP-pg4", "pp"),
    ("DATA_PARALLEL_GROUP_WITH_CP-pg9", "dp"), ("CONTEXT_PARALLEL_GROUP-pg7", "cp"), ("EXPERT_MODEL_PARALLEL_GROUP-pg8", "ep"),
    ("pg-17", None), ("world", None), ("TENSOR_AND_DATA_PARALLEL_GROUP-pg3", None), ("MODEL_PARALLEL_GROUP-pg6", None),
    ("tpu-ring", None), ("depot", None),
])
def test_the_kind_a_name_says(name: str, kind: str | None) -> None:
    assert kind_in_name(name) == kind
