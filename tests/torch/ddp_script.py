"""An unmodified DDP script: `python ddp_script.py BACKEND OUT` under torchrun or
commrt-launch (env:// init); every rank saves its parameters after a few steps
to OUT with its rank before the suffix (out.npz -> out.0.npz, out.1.npz, ...)."""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist


def main():
    backend, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    dist.init_process_group(backend)              # env://, no `import commrt`
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(3):
        opt.zero_grad()
        ddp(torch.randn(4, 16, generator=g)).square().mean().backward()
        opt.step()
    root, ext = out.rsplit(".", 1)
    np.savez(f"{root}.{rank}.{ext}", *[p.detach().numpy() for p in model.parameters()],
             backend=np.array(dist.get_backend()), size=np.array(dist.get_world_size()))
    dist.destroy_process_group()
    if backend == "gloo":
        # Gloo's worker thread can drop the last reference to a finished work while
        # the interpreter shuts down, and the process then aborts ("terminate called
        # without an active exception"; commrt.bench._launch.end_gloo_rank): skip it
        os._exit(0)


if __name__ == "__main__":
    main()
