"""FSDP2 (fully_shard) on gloo/CPU with the CommOps logger attached in code: its all-gathers and
reduce-scatters go through the wrapped torch.distributed functions."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from collector import commops


def main() -> None:
    commops.attach()  # directory from LAGGARD_COMMOPS_DIR
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
    commops.detach()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
