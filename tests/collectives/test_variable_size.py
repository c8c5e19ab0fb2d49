"""all_gatherv, gatherv, scatterv and all_to_allv over worlds of 1-5 ranks (shared
memory and TCP): zero and odd counts, every dtype class, every root, both
all_gatherv algorithms; counts that disagree across ranks raise a mismatch."""
import pytest

import coll_ranks as R
from commrt.collectives import ALGORITHMS
from commrt.testing import World

SIZES = [(n, "shm") for n in (1, 2, 3, 4, 5)] + [(n, "tcp") for n in (2, 3, 5)]
DTYPES = ["bool", "int8", "uint16", "int64", "float16", "float32", "float64", "complex128"]


@pytest.fixture(scope="module", params=SIZES, ids=lambda p: f"{p[1]}{p[0]}")
def vworld(request, cost_env):
    n, transport = request.param
    with World(n, transport=transport, env=cost_env, timeout=120) as w:
        yield w


def test_every_dtype_class(vworld):
    for i, dtype in enumerate(DTYPES):
        algo = (list(ALGORITHMS["all_gatherv"]) + [None])[i % 3]
        vworld.run(R.varsize, i, dtype, algo, i % 2 == 1)


def test_counts_that_disagree_raise_a_mismatch(vworld):
    if vworld.size == 1:
        pytest.skip("one rank has no peer to disagree with")
    msgs = vworld.run(R.varsize_mismatch, timeout=60)
    for r, msg in enumerate(msgs):
        assert msg is not None and "mismatch" in msg, (r, msg)
    # the rank that saw it names the sizes in elements
    assert any("2 x int32" in m and "3 x int32" in m for m in msgs), msgs


def test_invalid_counts_fail_before_any_message(vworld):
    vworld.run(R.varsize_invalid)
