"""One collective per algorithm, with OpenMPI and Gloo: an alias of ``collectives``.

    python -m commrt.bench allreduce [--kind all_reduce|broadcast|...|barrier]
        [--algos all|auto|a,b] [any other option of ``collectives``]

The same as ``python -m commrt.bench collectives --kinds K --algos all``: one
collective (default all_reduce), every fixed algorithm beside ``auto`` unless
``--algos`` says otherwise, and ``auto/best`` (the automatic choice's time
over the best fixed algorithm's; target <= 1.10).  The per-collective names
(``broadcast``, ``all_gather``, ...) are this with their collective.
"""
from commrt.bench import collectives


def collectives_argv(argv, kind=None):
    """This alias's command line as ``collectives``' (``--kind K`` is ``--kinds K``)."""
    out = ["--kinds" if a == "--kind" else a.replace("--kind=", "--kinds=", 1)
           for a in argv]
    if not any(a == "--kinds" or a.startswith("--kinds=") for a in out):
        out = ["--kinds", kind or "all_reduce"] + out
    if not any(a == "--algos" or a.startswith("--algos=") for a in out):
        out += ["--algos", "all"]
    return out


def main(argv, kind=None):
    return collectives.main(collectives_argv(argv, kind))
