"""An mpi4py rank of the collective benchmarks.

``mpirun -np N python -m commrt.bench._coll_mpi --spec FILE --out DIR``: the
loop of ``_coll.measure`` over mpi4py's buffer collectives (Allreduce in
place, Bcast, Reduce, Gather, Scatter, Allgather, Reduce_scatter_block,
Alltoall, Barrier; and Allgatherv, Gatherv, Scatterv, Alltoallv), OpenMPI choosing its
algorithms (the "default" algorithm).
"""
import os
import sys

import numpy as np

from commrt.bench import _coll
from commrt.bench._launch import rank_args, write_json


class MpiOps:
    def __init__(self):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.rank, self.comm.size
        self._x = np.zeros(1, np.float64)

    def run(self, kind, algo, out, buf):
        c, MPI = self.comm, self.MPI
        if kind in _coll.VKINDS:
            self._run_v(kind, out, buf)
        elif kind == "all_reduce":
            c.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        elif kind == "broadcast":
            c.Bcast(buf, root=0)
        elif kind == "reduce":
            c.Reduce(MPI.IN_PLACE if self.rank == 0 else buf, buf if self.rank == 0 else None,
                     op=MPI.SUM, root=0)
        elif kind == "gather":
            c.Gather(buf, out if self.rank == 0 else None, root=0)
        elif kind == "scatter":
            c.Scatter(buf if self.rank == 0 else None, out, root=0)
        elif kind == "all_gather":
            c.Allgather(buf, out)
        elif kind == "all_to_all":
            c.Alltoall(buf, out)
        elif kind == "barrier":
            c.Barrier()
        else:
            c.Reduce_scatter_block(buf, out, op=MPI.SUM)

    def _run_v(self, kind, out, buf):
        c, n, r, counts = self.comm, self.size, self.rank, self.counts
        if kind == "all_gatherv":
            c.Allgatherv(buf, [out, counts])
        elif kind == "gatherv":
            c.Gatherv(buf, [out, counts] if r == 0 else None, root=0)
        elif kind == "scatterv":
            c.Scatterv([buf, counts] if r == 0 else None, out, root=0)
        else:
            c.Alltoallv([buf, counts[r]], [out, [counts[q][r] for q in range(n)]])

    def barrier(self):
        self.comm.Barrier()

    def agree(self, x):
        self._x[0] = x
        self.comm.Allreduce(self.MPI.IN_PLACE, self._x, op=self.MPI.MAX)
        return float(self._x[0])


def main(argv=None):
    args, spec = rank_args(argv)
    ops = MpiOps()
    result = _coll.measure(ops, spec)
    write_json(os.path.join(args.out, f"rank{ops.rank}.json"), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
