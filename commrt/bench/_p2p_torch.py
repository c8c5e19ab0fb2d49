"""A torch.distributed (Gloo) rank of the p2p benchmark.

``python -m commrt.bench._p2p_torch --rank R --world N --init file://... --spec FILE --out DIR``;
Gloo over TCP on 127.0.0.1 (GLOO_SOCKET_IFNAME=lo).  Buffers are CPU uint8
tensors sharing memory with page-aligned NumPy arrays.
"""
import os
import sys

from commrt.bench import _kernels
from commrt.bench._launch import end_gloo_rank, rank_args, write_json


def main(argv=None):
    args, spec = rank_args(argv, ranked=True)
    before = _kernels.proc_snapshot()
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=args.init, rank=args.rank,
                            world_size=args.world,
                            timeout=datetime.timedelta(seconds=spec.get("timeout_s", 300)))

    def alloc(n):
        return torch.from_numpy(_kernels.aligned(n))

    ops = _kernels.Ops(
        args.rank, args.world,
        lambda b, d, t: dist.send(b, d, tag=t),
        lambda b, s, t: dist.recv(b, s, tag=t),
        lambda b, d, t: dist.isend(b, d, tag=t),
        lambda b, s, t: dist.irecv(b, s, tag=t),
        lambda reqs: [r.wait() for r in reqs],
        alloc=alloc, array=lambda t: t.numpy(), name=f"gloo rank {args.rank}")
    after_init = _kernels.proc_snapshot()
    result = _kernels.run_tasks(ops, spec)
    result["proc"] = {"before_init": before, "after_init": after_init}
    result["library"] = f"torch {torch.__version__} gloo"
    dist.destroy_process_group()
    write_json(os.path.join(args.out, f"rank{args.rank}.json"), result)
    end_gloo_rank()


if __name__ == "__main__":
    sys.exit(main())
