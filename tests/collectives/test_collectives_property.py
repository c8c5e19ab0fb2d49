"""Every collective and algorithm against a NumPy reference, on worlds of 1-8 ranks
over shared memory and TCP: counts 0, 1, odd, not divisible by the world size and
large; every dtype and op; every root.  Integers exact, floats within a bound
that allows for the order of reduction; all-reduce results bitwise equal on
every rank."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import coll_ranks as R
from commrt.collectives import ALGORITHMS

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]
OPS = ["SUM", "PROD", "MIN", "MAX", "AVG", "LAND", "LOR", "BAND", "BOR", "BXOR"]
AR_ALGOS = list(ALGORITHMS["all_reduce"]) + [None]


def valid(op, dtype):
    kind = np.dtype(dtype).kind
    if kind == "b":
        return op != "AVG"
    if kind == "f":
        return op not in ("BAND", "BOR", "BXOR")
    if kind == "c":
        return op in ("SUM", "PROD", "AVG", "LAND", "LOR")
    return True


def counts(world, large=70_001):
    n = world.size
    return st.sampled_from(sorted({0, 1, 7, n - 1, n + 1, 3 * n + 2, 1001, large}))


COMMON = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))


def examples(world, shm):
    """Examples per test: a TCP world runs half as many (its messages are slower),
    as hypothesis settings chosen per transport, not as examples that return
    early."""
    return shm if world.transport == "shm" else max(1, shm // 2)


def test_all_reduce(world):
    @settings(max_examples=examples(world, 12), **COMMON)
    @given(data=st.data())
    def check(data):
        op = data.draw(st.sampled_from(OPS))
        dtype = data.draw(st.sampled_from([d for d in DTYPES if valid(op, d)]))
        algo = data.draw(st.sampled_from(AR_ALGOS))
        n = data.draw(counts(world))
        seed = data.draw(st.integers(0, 2**31))
        digests = world.run(R.all_reduce, seed, n, dtype, op, algo, timeout=60)
        assert len(set(digests)) == 1, "ranks disagree bitwise"
    check()


@pytest.mark.parametrize("algo", list(ALGORITHMS["all_reduce"]))
def test_all_reduce_large_and_async(world, algo):
    if world.transport == "tcp" and world.size not in (2, 5, 8):
        pytest.skip("large messages over TCP: sizes 2, 5 and 8 cover it")
    n = 3 * (1 << 18) + world.size  # 3 MiB of float32, several segments per chunk
    digests = world.run(R.all_reduce, 7, n, "float32", "SUM", algo, True, timeout=90)
    assert len(set(digests)) == 1


def test_broadcast_and_reduce(world):
    @settings(max_examples=examples(world, 16), **COMMON)
    @given(data=st.data())
    def check(data):
        n = data.draw(counts(world))
        dtype = data.draw(st.sampled_from(DTYPES))
        root = data.draw(st.integers(0, world.size - 1))
        seed = data.draw(st.integers(0, 2**31))
        world.run(R.broadcast, seed, n, dtype, root, data.draw(st.sampled_from(
            list(ALGORITHMS["broadcast"]) + [None])))
        op = data.draw(st.sampled_from([o for o in OPS if valid(o, dtype)]))
        world.run(R.reduce, seed, n, dtype, op, root, data.draw(st.sampled_from(
            list(ALGORITHMS["reduce"]) + [None])))
    check()


def test_gathers_and_scatters(world):
    @settings(max_examples=examples(world, 16), **COMMON)
    @given(data=st.data())
    def check(data):
        n = data.draw(counts(world, large=20_001))  # per block: buffers hold size x n
        dtype = data.draw(st.sampled_from(DTYPES))
        seed = data.draw(st.integers(0, 2**31))
        root = data.draw(st.integers(0, world.size - 1))
        world.run(R.all_gather, seed, n, dtype,
                  data.draw(st.sampled_from(list(ALGORITHMS["all_gather"]) + [None])))
        op = data.draw(st.sampled_from([o for o in OPS if valid(o, dtype)]))
        world.run(R.reduce_scatter, seed, n, dtype, op,
                  data.draw(st.sampled_from(list(ALGORITHMS["reduce_scatter"]) + [None])))
        world.run(R.gather, seed, n, dtype, root)
        world.run(R.scatter, seed, n, dtype, root)
        world.run(R.all_to_all, seed, n, dtype)
    check()


def test_every_root(world):
    for root in range(world.size):
        for algo in ALGORITHMS["broadcast"]:
            world.run(R.broadcast, root, 1001, "int32", root, algo)
        for algo in ALGORITHMS["reduce"]:
            world.run(R.reduce, root, 1001, "float64", "SUM", root, algo)
        world.run(R.gather, root, 5, "int16", root)
        world.run(R.scatter, root, 5, "int16", root)


def test_objects(world):
    for seed in (0, 3, 4999, 123456):
        world.run(R.objects, seed)
