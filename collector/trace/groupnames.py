"""The trace's name for a torch process group: one rule for the CommOps logger and the importers.

torch gives each group a name (a counter, the same on every rank) and an optional description.
A description that names one group, in the `<kind>-<index>` form this project documents
(`tp-0`, `dp-3`), is the group's name. Frameworks describe a kind of group instead, and give every
group of the kind the same description (Megatron's `TENSOR_MODEL_PARALLEL_GROUP`, DeviceMesh's
`mesh_tp` or `mesh_dim_0`): taken alone it would merge all of them into one group whose operators
share one sequence, so such a description is qualified with the torch name
(`TENSOR_MODEL_PARALLEL_GROUP-pg38`).
"""

from __future__ import annotations

import re

#: a description that names one group: a kind and an index
_ONE_GROUP = re.compile(r"[A-Za-z]+-\d+")


def group_label(torch_name: str, desc: str) -> str:
    """The group's name in the trace: 'world' for the default group, its one-group description,
    a kind's description qualified with the torch name, or 'pg-<torch name>'."""
    if desc == "default_pg" or (torch_name in ("0", "default_pg") and desc in ("", "undefined")):
        return "world"
    if not desc or desc == "undefined":
        return f"pg-{torch_name}"
    return desc if _ONE_GROUP.fullmatch(desc) else f"{desc}-pg{torch_name}"


#: how frameworks describe a kind of group (Megatron-core's parallel_state), lower case, by prefix
_FRAMEWORK_KINDS = (("tensor_model_parallel", "tp"), ("pipeline_model_parallel", "pp"),
                    ("context_parallel", "cp"), ("expert_model_parallel", "ep"), ("data_parallel", "dp"))
_KIND = r"(dp|tp|pp|ep|cp)(?![a-z])"
_KIND_FIRST = re.compile(_KIND, re.IGNORECASE)
_KIND_TOKEN = re.compile(r"[_\W]" + _KIND, re.IGNORECASE)


def kind_in_name(name: str) -> str | None:
    """The parallelism a group's name says ("tp-3", "dp_0", DeviceMesh's "mesh_tp", Megatron's
    "TENSOR_MODEL_PARALLEL_GROUP"), or None for a name that says none ("pg-17", "world",
    "TENSOR_AND_DATA_PARALLEL_GROUP"). A name is a hint: the records decide where they can."""
    low = name.lower()
    for prefix, kind in _FRAMEWORK_KINDS:
        if low.startswith(prefix):
            return kind
    m = _KIND_FIRST.match(name) or _KIND_TOKEN.search(name)
    return m.group(1).lower() if m is not None else None
