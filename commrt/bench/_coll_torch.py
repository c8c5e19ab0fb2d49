"""A torch.distributed (Gloo) rank of the collective benchmarks.

``python -m commrt.bench._coll_torch --rank R --world N --init file://... --spec FILE --out DIR``:
the loop of ``_coll.measure`` over dist.all_reduce, broadcast, reduce, gather, scatter,
all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single (with split sizes for
all_to_allv; Gloo has no gathers or scatters of unequal blocks) and barrier (Gloo over
TCP on 127.0.0.1), on CPU float32 tensors
sharing memory with the NumPy buffers.
"""
import datetime
import os
import sys

from commrt.bench import _coll
from commrt.bench._launch import end_gloo_rank, rank_args, write_json


class TorchOps:
    # Gloo gathers and scatters blocks of one size only: no rows for these
    unsupported = ("all_gatherv", "gatherv", "scatterv")

    def __init__(self, rank, world):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.rank, self.size = rank, world
        self._x = torch.zeros(1, dtype=torch.float64)
        self._cache = {}

    def _t(self, a):
        if a is None:
            return None
        key = (a.ctypes.data, a.size)
        t = self._cache.get(key)
        if t is None:
            t = self._cache[key] = self.torch.from_numpy(a)
        return t

    def _chunks(self, t):
        key = ("chunks", t.data_ptr(), t.numel())
        c = self._cache.get(key)
        if c is None:
            c = self._cache[key] = list(t.chunk(self.size))
        return c

    def run(self, kind, algo, out, buf):
        d = self.dist
        b, o = self._t(buf), self._t(out)
        root = self.rank == 0
        if kind == "all_to_allv":
            c = self.counts
            d.all_to_all_single(o, b, [c[q][self.rank] for q in range(self.size)], c[self.rank])
        elif kind == "all_reduce":
            d.all_reduce(b)
        elif kind == "broadcast":
            d.broadcast(b, 0)
        elif kind == "reduce":
            d.reduce(b, 0)
        elif kind == "gather":
            d.gather(b, self._chunks(o) if root else None, dst=0)
        elif kind == "scatter":
            d.scatter(o, self._chunks(b) if root else None, src=0)
        elif kind == "all_to_all":
            d.all_to_all_single(o, b)
        elif kind == "barrier":
            d.barrier()
        elif kind == "all_gather":
            try:
                d.all_gather_into_tensor(o, b)
            except (RuntimeError, AttributeError):
                d.all_gather(list(o.chunk(self.size)), b)
        else:
            try:
                d.reduce_scatter_tensor(o, b)
            except (RuntimeError, AttributeError):  # Gloo lacks it: reduce + scatter by hand
                d.all_reduce(b)
                m = o.numel()
                o.copy_(b[self.rank * m:(self.rank + 1) * m])

    def barrier(self):
        self.dist.barrier()

    def agree(self, x):
        self._x[0] = x
        self.dist.all_reduce(self._x, op=self.dist.ReduceOp.MAX)
        return float(self._x[0])


def main(argv=None):
    args, spec = rank_args(argv, ranked=True)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=args.init, rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=300))
    _coll.bind(args.rank, args.world)
    result = _coll.measure(TorchOps(args.rank, args.world), spec)
    result["library"] = f"torch {torch.__version__} gloo"
    dist.destroy_process_group()
    write_json(os.path.join(args.out, f"rank{args.rank}.json"), result)
    end_gloo_rank()


if __name__ == "__main__":
    sys.exit(main())
