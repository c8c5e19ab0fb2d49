"""The α-β-γ cost model that picks algorithms, with parameters measured per transport.

    α  seconds per message (software and wire latency, one way)
    β  seconds per byte moved between two ranks (1 / bandwidth)
    γ  seconds per byte reduced by the kernel (float32 sum)

Every algorithm module has ``cost(n, nbytes, params)`` built from these (see
its docstring and docs/algorithms.md); ``algorithm=None`` takes the
cheapest.  Two corrections make the model fit a shared-memory host:

* ``nseg``: a message is cut in segments of COMMRT_RING_SEGMENT_BYTES and
  each costs α of software time;
* ``rho``: when more ranks than cores compute at once (N ranks on C cores),
  the steps in which every rank copies or reduces take N/C times longer;
  algorithms where one rank works at a time (ps) do not pay it.

Measurement (``calibrate``, a collective, once per communicator family):
rank 0 and rank 1 ping-pong 8 B and 1 MiB (α = half the 8 B round trip,
β from the 1 MiB one), rank 0 times reduce_into on 1 MiB of float32 (γ),
and rank 0 broadcasts the three numbers so every rank picks the same
algorithm.  The numbers are cached in COMMRT_COST_CACHE per (transport,
host, cores), so later jobs skip the ping-pong.  COMMRT_ALLREDUCE_ALGO
overrides the all-reduce choice.
"""
import json
import math
import os
import socket
import time
from dataclasses import asdict, dataclass

import numpy as np

from commrt import config


@dataclass
class Params:
    alpha: float
    beta: float
    gamma: float
    segment: int = 1 << 20
    cores: int = 1
    local: int = 1          # most ranks on one host
    transport: str = "shm"
    source: str = "measured"

    def nseg(self, nbytes):
        return max(1, math.ceil(nbytes / self.segment))

    def rho(self, n_active):
        return max(1.0, min(n_active, self.local) / self.cores)


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _cache_path():
    path = config.get("COMMRT_COST_CACHE")
    return os.path.expanduser(path) if path else None


def _cache_key(transport):
    return f"{transport}:{socket.gethostname()}:{_cores()}"


def _load(transport):
    path = _cache_path()
    if not path:
        return None
    try:
        with open(path) as f:
            entry = json.load(f).get(_cache_key(transport))
        return None if entry is None else (entry["alpha"], entry["beta"], entry["gamma"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store(transport, alpha, beta, gamma):
    path = _cache_path()
    if not path:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = {}
        data[_cache_key(transport)] = {"alpha": alpha, "beta": beta, "gamma": gamma,
                                       "when": time.time()}
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass


def _pingpong(call, peer, nbytes, iters, first):
    """One-way time of nbytes: half the median round trip (a median, because a
    loaded host stalls now and then and one stall must not set the model)."""
    buf = np.zeros(max(1, nbytes), np.uint8)
    times = []
    for i in range(iters + 2):
        t0 = time.perf_counter()
        if first:
            call.isend(buf, peer)
            call.wait_sends()
            call.recv(buf, peer)
        else:
            call.recv(buf, peer)
            call.isend(buf, peer)
            call.wait_sends()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] / 2


def _measure_gamma():
    from commrt.kernels import reduce_into

    a = np.zeros(1 << 18, np.float32)
    b = np.ones(1 << 18, np.float32)
    reduce_into(a, b, "sum", parallel=False)
    times = []
    for _ in range(9):
        t0 = time.perf_counter()
        reduce_into(a, b, "sum", parallel=False)
        times.append(time.perf_counter() - t0)
    return sorted(times)[4] / a.nbytes


def _transport(comm):
    kinds = {comm.transport_of(q) for q in range(comm.size)} - {"self"}
    return "tcp" if "tcp" in kinds else ("shm" if kinds else "self")


def _local_max(comm):
    counts = {}
    for q in range(comm.size):
        h = comm.host_of(q)
        counts[h] = counts.get(h, 0) + 1
    return max(counts.values())


def params(comm, timeout=None):
    """The cost parameters of comm (a collective the first time on a communicator
    family: every rank must call it at the same point, as they do when they all
    call a collective with algorithm=None)."""
    from commrt.collectives._engine import Call, execute, state_of

    c = comm
    while c is not None:
        p = state_of(c).cache.get("cost")
        if p is not None:
            if c is not comm:
                state_of(comm).cache["cost"] = p
            return p
        c = getattr(c, "_parent", None)
    if comm.size == 1:
        p = Params(0.0, 0.0, _measure_gamma(), cores=_cores(), transport="self", source="size 1")
        state_of(comm).cache["cost"] = p
        return p
    transport = _transport(comm)
    call = Call(comm, "calibrate", count=3, dtype=np.float64, algo="binomial", timeout=timeout)
    from commrt.collectives.algorithms import broadcast as _bcast

    def run():
        vals = np.zeros(4, np.float64)
        if comm.rank == 0:
            cached = _load(transport)
            if cached is not None:
                vals[:] = (1.0, *cached)
        _bcast.binomial(call, vals, 0)
        call.wait_sends()
        source = "cached"
        if vals[0] == 0.0:
            source = "measured"
            peer = 1
            if comm.rank in (0, peer):
                first = comm.rank == 0
                alpha = _pingpong(call, 1 - comm.rank, 8, 30, first)
                big = _pingpong(call, 1 - comm.rank, 1 << 20, 9, first)
                if first:
                    vals[:] = (1.0, alpha, max(1e-12, (big - alpha) / (1 << 20)), _measure_gamma())
            _bcast.binomial(call, vals, 0)
            call.wait_sends()
            if comm.rank == 0:
                _store(transport, *vals[1:])
        return Params(float(vals[1]), float(vals[2]), float(vals[3]),
                      segment=config.get("COMMRT_RING_SEGMENT_BYTES"), cores=_cores(),
                      local=_local_max(comm), transport=transport, source=source)

    p = execute(call, run, False)
    state_of(comm).cache["cost"] = p
    return p


def predict_allreduce(comm, nbytes, p=None):
    """{algorithm: predicted seconds} for an all-reduce of nbytes on comm."""
    from commrt.collectives import allreduce

    p = p or params(comm)
    out = {}
    for name in allreduce.NAMES:
        mod = allreduce.module(name)
        if name == "hierarchical":
            if not mod.eligible(comm):
                continue
            out[name] = mod.cost(comm.size, nbytes, p, mod.host_groups(comm))
        else:
            out[name] = mod.cost(comm.size, nbytes, p)
    return out


def choose_allreduce(comm, nbytes):
    """The all-reduce algorithm for nbytes on comm: COMMRT_ALLREDUCE_ALGO, else the
    cheapest by the model (memoised per size; the same on every rank)."""
    from commrt.collectives._engine import state_of

    forced = config.get("COMMRT_ALLREDUCE_ALGO")
    if forced:
        return forced
    if comm.size == 1:
        return "ring"
    memo = state_of(comm).cache.setdefault("allreduce_choice", {})
    algo = memo.get(nbytes)
    if algo is None:
        pred = predict_allreduce(comm, nbytes)
        algo = memo[nbytes] = min(pred, key=pred.get)
    return algo


def choose(module, comm, nbytes):
    """The cheapest of a collective module's ALGORITHMS (broadcast, reduce, ...)."""
    from commrt.collectives._engine import state_of

    if comm.size == 1:
        return module.ALGORITHMS[0]
    memo = state_of(comm).cache.setdefault(("choice", module.__name__), {})
    algo = memo.get(nbytes)
    if algo is None:
        p = params(comm)
        algo = memo[nbytes] = min(module.ALGORITHMS,
                                  key=lambda a: module.cost(a, comm.size, nbytes, p))
    return algo


def describe(comm):
    return asdict(params(comm))
