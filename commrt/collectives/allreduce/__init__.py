"""All-reduce algorithms, one module each; ``ALGORITHMS`` maps names to modules.

Each module has ``run(call, buf, reduce)`` (ps also takes ``reduce_many``)
and ``cost(n, nbytes, params)``; its docstring gives its steps and its
α-β-γ cost.  The public entry point is ``commrt.collectives.all_reduce``.
"""
import importlib

NAMES = ("ring", "ps", "reduce_bcast", "tree", "rabenseifner", "recursive_doubling",
         "hierarchical", "dbtree")


def module(name):
    if name not in NAMES:
        raise ValueError(f"unknown all-reduce algorithm {name!r}; expected one of {', '.join(NAMES)}")
    return importlib.import_module(f"commrt.collectives.allreduce.{name}")
