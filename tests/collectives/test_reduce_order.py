"""The algorithms that combine messages as they land (reduce-receives) keep their
documented operand order: float32 SUM results bit for bit against NumPy in
that order, over several segments, with nodes that combine two or more
peers' messages into the same bytes (tree and binomial nodes with two
children, the direct reduce-scatter's N-1 copies, the fold of a
non-power-of-two world), on shared memory and TCP."""
import pytest

import order_ranks as O
from commrt.testing import World

COUNT = 3 * (1 << 16) + 7  # float32: over three 256 KiB segments


@pytest.fixture(scope="module", params=[(5, "shm"), (6, "tcp")], ids=["shm5", "tcp6"])
def w(request, cost_env):
    n, transport = request.param
    with World(n, transport=transport, env=cost_env, timeout=120) as world:
        yield world


@pytest.mark.parametrize("algo", ["tree", "reduce_bcast", "ps", "recursive_doubling"])
def test_all_reduce_order(w, algo):
    for seed in (1, 2):
        w.run(O.all_reduce, seed, COUNT, algo)


def test_reduce_and_reduce_scatter_order(w):
    for root in (0, 2):
        w.run(O.reduce, root, COUNT, root)
    w.run(O.reduce_scatter, 3, 40_001)
