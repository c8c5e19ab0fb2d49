"""The registry is the only list of algorithms: every module of
collectives/<collective>/ follows the convention, its wire codes fit the
fingerprint, the docs list what it holds, and every algorithm's schedule is
consistent across ranks (each send has its receive, same size, in order)."""
import collections
import pathlib

import pytest

import commrt.collectives as C
from commrt.collectives import cost, registry

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


def test_public_functions_are_not_shadowed_by_their_packages():
    for coll in registry.collectives():
        assert callable(getattr(C, coll)), coll


def test_every_algorithm_follows_the_convention():
    for coll, mods in registry.table().items():
        for name, mod in mods.items():
            assert mod.__doc__ and "Cost" in mod.__doc__, (coll, name, "block comment")
            assert callable(mod.run) and callable(mod.cost), (coll, name)
            p = cost.Params(1e-6, 1e-10, 1e-11, 1e-11, 2e-6, 2e-11, cores=2, local=4)
            assert mod.cost(1, 1 << 20, p) == 0.0, (coll, name, "one rank costs nothing")
            if getattr(mod, "eligible", None) is None:
                assert mod.cost(4, 1 << 20, p) > 0, (coll, name)


def test_wire_codes_are_distinct_per_collective_and_fit():
    for coll in registry.collectives():
        codes = [registry.code(coll, a) for a in registry.names(coll)]
        assert len(set(codes)) == len(codes) and all(0 < c < 1 << registry.CODE_BITS
                                                     for c in codes), (coll, codes)
        assert [registry.name_of(coll, c) for c in codes] == list(registry.names(coll))


def test_unknown_names_are_clear_errors():
    with pytest.raises(ValueError, match="unknown all-reduce algorithm 'butterfly'"):
        registry.module("all_reduce", "butterfly")
    with pytest.raises(ValueError, match="no collective"):
        registry.module("allreduce", "ring")


def test_the_docs_list_the_registry():
    assert registry.describe() in (DOCS / "algorithms.md").read_text(), \
        "regenerate the table in docs/algorithms.md from registry.describe()"


def test_choice_ties_go_to_the_registry_order():
    pred = {"b": 1.0, "a": 1.0, "c": 0.5}
    assert cost.cheapest(pred) == "c"
    assert cost.cheapest({"b": 1.0, "a": 1.0}) == "b"   # dict order = tie-break order


def _pairing(coll, name, n, count, root, **kw):
    """Every rank's schedule: the messages from a to b on one context, in order,
    must match b's receives from a there in number and size (as the transport
    matches them)."""
    mod = registry.module(coll, name)
    sent = collections.defaultdict(list)
    got = collections.defaultdict(list)
    for r in range(n):
        for step in mod.schedule(n, r, count, root, **kw):
            for m in step:
                assert 0 <= m.peer < n and m.peer != r and m.lo <= m.hi, (coll, name, r, m)
                assert m.op in ("send", "recv", "combine"), m.op
                if m.op == "send":
                    sent[(r, m.peer, m.ctx)].append(m.hi - m.lo)
                else:
                    got[(m.peer, r, m.ctx)].append(m.hi - m.lo)
    assert dict(sent) == dict(got), (coll, name, n, count, root, kw)


def _variable(coll):
    return coll.endswith("v")


@pytest.mark.parametrize("coll,name", [(c, a) for c in registry.collectives()
                                       for a in registry.names(c) if not _variable(c)])
def test_schedules_pair_up(coll, name):
    for n in range(1, 10):
        for count in (0, 1, 7, 3 * n + 2, 1000):
            for root in sorted({0, n - 1, n // 2}):
                if coll == "reduce_scatter":
                    count_ = count * n  # its count is the input's
                else:
                    count_ = count
                _pairing(coll, name, n, count_, root)


def test_segmented_schedules_pair_up_over_many_segments():
    """Several segments per chunk and per tree (itemsize 1 KiB: 256 elements to a
    segment of 256 KiB), and hierarchical over uneven hosts."""
    for coll, name in [("all_reduce", a) for a in ("ring", "tree", "ps", "dbtree",
                                                   "hierarchical")] + \
            [("reduce", "ring"), ("broadcast", "pipeline"), ("reduce_scatter", "ring")]:
        for n in (2, 3, 5, 8):
            count = 2000 * (n if coll == "reduce_scatter" else 1) + 3
            _pairing(coll, name, n, count, n - 1, itemsize=1024)
    for groups in ([[0, 1], [2, 3], [4]], [[0], [1, 2, 3]], [[0, 2], [1, 3, 4, 5]]):
        n = sum(map(len, groups))
        for count in (1, 1000, 300_000):
            _pairing("all_reduce", "hierarchical", n, count, 0, groups=groups, itemsize=4)


@pytest.mark.parametrize("coll,name", [(c, a) for c in registry.collectives()
                                       for a in registry.names(c) if _variable(c)])
def test_variable_size_schedules_pair_up(coll, name):
    import random

    rng = random.Random(7)
    for n in range(1, 8):
        for _ in range(4):
            if coll == "all_to_allv":
                counts = [[rng.choice((0, 1, 5, 300)) for _ in range(n)] for _ in range(n)]
            else:
                counts = [rng.choice((0, 1, 5, 300)) for _ in range(n)]
            for root in sorted({0, n - 1}):
                _pairing(coll, name, n, counts, root)


def test_every_algorithm_has_a_schedule():
    missing = [(c, a) for c in registry.collectives() for a in registry.names(c)
               if not callable(getattr(registry.module(c, a), "schedule", None))]
    assert not missing, missing
