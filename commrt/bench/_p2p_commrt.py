"""A commrt rank of the p2p benchmark (started by _launch.run_commrt).

``python -m commrt.bench._p2p_commrt --spec FILE --out DIR`` in an
environment set by the starter: ``commrt.init()``, the tasks of the spec,
results to DIR/rank<R>.json.  ``entry(comm, spec)`` is the same for a rank
started by ``commrt.testing.World``.
"""
import os
import sys

from commrt.bench import _kernels
from commrt.bench._launch import rank_args, write_json


def ops_for(comm):
    import commrt

    def info():
        out = {}
        for name in ("memory_info", "stats"):
            fn = getattr(comm, name, None)
            if callable(fn):
                try:
                    out[name] = fn()
                except Exception as exc:          # report, do not fail the benchmark
                    out[name] = f"error: {exc!r}"
        return out or None

    return _kernels.Ops(comm.rank, comm.size, comm.send, comm.recv, comm.isend, comm.irecv,
                        commrt.wait_all, name=f"commrt rank {comm.rank}", info=info)


def entry(comm, spec):
    """Run spec's tasks on an initialised communicator; this rank's results."""
    return _kernels.run_tasks(ops_for(comm), spec)


def main(argv=None):
    args, spec = rank_args(argv)
    before = _kernels.proc_snapshot()
    import commrt

    comm = commrt.init()
    after_init = _kernels.proc_snapshot()
    result = entry(comm, spec)
    comm.close()
    result["proc"] = {"before_init": before, "after_init": after_init,
                      "after_close": _kernels.proc_snapshot()}
    write_json(os.path.join(args.out, f"rank{comm.rank}.json"), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
