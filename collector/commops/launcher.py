"""Where a rank runs and which job it belongs to, read from its launcher's environment.

The CommOps logger runs inside every rank; these pure functions turn the environment that
torchrun, Slurm or Kubernetes gave the rank into the fields of meta.json, so the localizer can
tell hosts (and so NICs) apart without the user writing meta.json by hand.

Host, first found wins:
  LAGGARD_HOST       set it when nothing else names the node (several agents on one machine)
  SLURMD_NODENAME    Slurm: the node srun placed this task on
  NODE_NAME          Kubernetes: the node a pod runs on (downward API: spec.nodeName); a pod's
                     own HOSTNAME is the pod's name, not the machine it shares a NIC with
  the hostname       socket.gethostname() (a pod's name under Kubernetes without NODE_NAME)
Job: LAGGARD_JOB; Slurm's SLURM_JOB_NAME-SLURM_JOB_ID; torchrun's TORCHELASTIC_RUN_ID (unless its
  placeholder "none"); else the name of the directory the logger writes to.
Device index (meta's `gpu`): torchrun's LOCAL_RANK, else Slurm's SLURM_LOCALID, else 0.
Parallelism: declared by the job, commops.attach(parallelism={"tp": 2, "pp": 2, "dp": 2}) or
  LAGGARD_PARALLELISM=tp=2,pp=2,dp=2; dimensions not given are 1.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from collector.trace.meta import PARALLEL_DIMS

HOST_VARS = ("LAGGARD_HOST", "SLURMD_NODENAME", "NODE_NAME")
ENV_PARALLELISM = "LAGGARD_PARALLELISM"


def host_of(env: Mapping[str, str], hostname: str | None = None) -> tuple[str, str]:
    """(host, where it came from): the first non-empty of HOST_VARS, else the hostname."""
    for var in HOST_VARS:
        value = env.get(var, "").strip()
        if value:
            return value, var
    return (hostname if hostname is not None else socket.gethostname()), "hostname"


def job_of(env: Mapping[str, str], out_dir_name: str = "") -> str:
    """The job's name (see the module docstring for the order)."""
    name = env.get("LAGGARD_JOB", "").strip()
    if name:
        return name
    slurm_name, slurm_id = env.get("SLURM_JOB_NAME", "").strip(), env.get("SLURM_JOB_ID", "").strip()
    if slurm_name or slurm_id:
        return "-".join(x for x in (slurm_name or "slurm", slurm_id) if x)
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id != "none":
        return run_id
    return out_dir_name or "commops"


def device_index(env: Mapping[str, str]) -> int:
    """The rank's device on its host: LOCAL_RANK (torchrun), SLURM_LOCALID (srun), else 0."""
    for var in ("LOCAL_RANK", "SLURM_LOCALID"):
        value = env.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def node_rank(env: Mapping[str, str]) -> int:
    """torchrun's GROUP_RANK (the agent's node index), Slurm's SLURM_NODEID, else -1."""
    for var in ("GROUP_RANK", "SLURM_NODEID"):
        value = env.get(var, "").strip()
        if value.isdigit():
            return int(value)
    return -1


def parse_parallelism(spec: str | Mapping[str, object]) -> dict[str, int]:
    """{"dp": D, "tp": T, "pp": P, "ep": E, "cp": C} from "tp=2,pp=2,dp=2" or a mapping.

    Raises ValueError naming the bad part: an unknown dimension or a size that is not a
    positive integer.
    """
    if isinstance(spec, str):
        items: list[tuple[str, object]] = []
        for part in spec.replace(" ", "").split(","):
            if not part:
                continue
            dim_text, sep, size_text = part.partition("=")
            if not sep:
                raise ValueError(f"'{part}' is not DIM=SIZE (e.g. tp=2,pp=2,dp=2)")
            items.append((dim_text, size_text))
    else:
        items = list(spec.items())
    out = dict.fromkeys(PARALLEL_DIMS, 1)
    for key, value in items:
        dim = str(key).lower()
        if dim not in PARALLEL_DIMS:
            raise ValueError(f"unknown parallel dimension '{key}' (known: {', '.join(PARALLEL_DIMS)})")
        try:
            size = int(str(value))
        except ValueError:
            size = 0
        if size < 1 or str(size) != str(value).strip():
            raise ValueError(f"{dim}={value}: the size must be a positive integer")
        out[dim] = size
    return out


def identity(env: Mapping[str, str], parallelism: Mapping[str, int] | None = None) -> dict[str, object]:
    """What a rank writes about itself in ranks/rank-R.json beside its groups and counters."""
    host, source = host_of(env)
    out: dict[str, object] = {"host": host, "host_from": source, "gpu": device_index(env), "node_rank": node_rank(env)}
    if parallelism:
        out["parallelism"] = dict(parallelism)
    return out
