"""An mpi4py rank of the p2p benchmark.

``mpirun -np N python -m commrt.bench._p2p_mpi --spec FILE --out DIR``.

The same loops as commrt's (``_kernels``), calling mpi4py's buffer methods
(Send/Recv/Isend/Irecv, Request.Waitall) directly.  mpi4py initialises MPI
with its default thread level (MPI_THREAD_MULTIPLE).
"""
import os
import sys

from commrt.bench import _kernels
from commrt.bench._launch import rank_args, write_json


def main(argv=None):
    args, spec = rank_args(argv)
    before = _kernels.proc_snapshot()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ops = _kernels.Ops(comm.rank, comm.size, comm.Send, comm.Recv, comm.Isend, comm.Irecv,
                       MPI.Request.Waitall, name=f"mpi4py rank {comm.rank}")
    after_init = _kernels.proc_snapshot()
    result = _kernels.run_tasks(ops, spec)
    result["proc"] = {"before_init": before, "after_init": after_init}
    result["library"] = MPI.Get_library_version().strip().splitlines()[0]
    write_json(os.path.join(args.out, f"rank{comm.rank}.json"), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
