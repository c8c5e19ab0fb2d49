"""A commrt rank of ``bench hosts``, started by commrt-launch across namespace hosts.

``python -m commrt.bench._hosts_rank --spec FILE --out DIR``: the collective
benchmarks' loop (``_coll.measure``) over commrt's all-reduce, after the cost
model's calibration (its parameters go in the results: ``params``, and the
algorithm ``auto`` ran at each size: ``choices``; with ``"sim": true`` in the
spec, also the simulator's point-to-point figures: ``sim``); rank 0
writes ``rank0.json`` (the times are already the slowest rank's).
"""
from dataclasses import asdict
import os
import sys

from commrt.bench import _coll
from commrt.bench._launch import rank_args, write_json


def main(argv=None):
    import commrt

    args, spec = rank_args(argv)
    from commrt.collectives import cost

    comm = commrt.init()
    try:
        params = asdict(cost.params(comm))   # every rank at once: a collective
        # the simulator's point-to-point figures (sim validate --hosts)
        sim = None
        if spec.get("sim"):
            from commrt.sim.validate import hosts_calibration
            sim = hosts_calibration(comm)
        result = dict(_coll.measure(_coll.CommrtOps(comm), spec), params=params, sim=sim)
        # what auto ran at each size (the model's choice, memoised by the calls above)
        result["choices"] = {str(n): cost.choose_allreduce(comm, n) for n in spec["sizes"]}
        if comm.rank == 0:
            write_json(os.path.join(args.out, "rank0.json"), result)
    finally:
        comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
