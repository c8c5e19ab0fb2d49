"""The simulator against commrt's own measurements on this machine (shared memory).

    python -m commrt.sim validate [--ranks 2,4,8] [--sizes 64K,1M,16M]
        [--algos NAME,...] [--rounds 3] [--json out.json]
    python -m commrt.sim validate --hosts 2 --ranks-per-host 2 --rates 1gbit,10gbit ...
    python -m commrt.sim validate --replay out.json [...] [--terms T,...|none|all]

Per world size N and round: α, β and γ come from commrt's calibration of an
N-rank job (cost.params: an 8-byte and a 1 MiB exchange between two ranks,
reduce_into on rank 0, in cache and out of it (γ_mem); never α_busy, which
the cost model takes from an 8-byte collective), and the simulator's own
point-to-point and kernel figures (TERMS, each switchable): β per message
size (two ranks exchanging alone), where N ranks outnumber the cores the
shift exchange (every rank at once sendrecv with rank ± d; fitted back
through the engine into α per size, ``shift``, which is a wait for a core,
``wait``; the same exchanges run as one exchange chain give the prepared
plans' α per size, ``chain``: their steps wait as a chain's do), the
general path's own work per call (timed on a one-rank communicator, where
no message moves: ``call``), γ_mem with the cores all combining
(``gamma_busy``), the eager limit (``rendezvous``), the one-way β of a
message its idle sender's core helps move (``oneway``), and a one-way β
curve with the memory two copies share (``bus``, measured, not used by
default).  The all-reduces are then measured with the collective
benchmarks' loop (``bench allreduce``'s ``run_commrt``) and simulated from
the algorithms' schedules, one node of N ranks.  No fit ever sees a
collective's time.  Reports measured and simulated time and their ratio
(target: within 25%).  With ``--json`` the calibration is saved beside the
cells, and ``--replay`` simulates saved cells again with the model as it is
now (``--terms`` picks its terms): measure once, change the model offline.
With ``--hosts``, the same across network namespace hosts at each link rate
(``bench hosts``'s job, whose calibration gives both link classes, plus
hosts_calibration's point-to-point figures: HOST_TERMS).  Figures are for a
quiet machine.

The host's state: this kind of host (a 2-core VM) flips between a fast state
and a slow one where shared-memory streams crawl 10x (``bench hoststate``),
for seconds to minutes.  A round calibrated in one state and measured in the
other tests the host, not the model, so each round (each N, or each link
rate's job) waits for the fast state, is bracketed by a probe, and runs
again (up to 3 tries in all) where the state changed under it
(``bench.hoststate.in_fast_state``; ``--any-state`` runs at once).  The
counts are of the rounds fast at both ends (``steady``; the probes are
saved as each round's ``"host"``, so a replay counts the same way); the
table and the last line say how many rounds that left and the count over
all of them.
"""
import argparse
import dataclasses
import functools
import json
import sys

from commrt.bench._stats import Summary, fmt_size, parse_size, table
from commrt.sim import schedules
from commrt.sim.engine import ScheduleError, Topology, simulate


# algorithms for several hosts only: not measured on one
MULTI_HOST = ("hierarchical",)


def _params(comm):
    from commrt.collectives import cost

    p = cost.params(comm)
    return {"alpha": p.alpha, "beta": p.beta, "gamma": p.gamma, "gamma_mem": p.gamma_mem,
            "segment": p.segment, "alpha_plan": p.alpha_plan}


# message sizes of the β curve: an exchange of each between ranks 0 and 1 (8 KiB
# eager, from 32 KiB the streamed path's handshake, from 2 MiB process_vm_readv:
# COMMRT_CMA_MIN_BYTES auto where ranks have a core each; 512 KiB because 1 MiB,
# the streamed path's last size, costs 1.4x its neighbours' β per byte here)
BETA_SIZES = (8 << 10, 32 << 10, 64 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20,
              16 << 20)
# message sizes of the shift exchange (every rank at once, where ranks outnumber
# the cores: eager, streamed, and from 1 MiB process_vm_readv)
SHIFT_SIZES = (8 << 10, 32 << 10, 128 << 10, 512 << 10, 1 << 20, 2 << 20, 8 << 20)


def _pair_buffers(nbytes):
    """(ones, zeros) of nbytes each, placed as the benchmarks place theirs
    (bench/_coll.py ALIGN): a kernel copy between buffers of different
    alignment mod 64 runs 1.5-5x slower, so the calibration's point-to-point
    figures and the measured collectives must agree on it."""
    import numpy as np

    from commrt.bench._coll import zeros

    out, into = zeros(-(-nbytes // 4)), zeros(-(-nbytes // 4))
    out[:] = 1.0
    return out.view(np.uint8)[:nbytes], into.view(np.uint8)[:nbytes]


def _exchange(comm, out, dst, into, src, timeout):
    """One step of an exchange as the schedules' plain receives make it: the
    receive posted, then the send, both waited for, the transport choosing
    who copies (comm.sendrecv reads half of an exchange with
    process_vm_readv from a quarter of COMMRT_CMA_MIN_BYTES up; the
    collectives' exchanges say themselves)."""
    rq = comm.irecv(into, src)
    sq = comm.isend(out, dst)
    rq.wait(timeout)
    sq.wait(timeout)


def _exchange_time(comm, peer, nbytes, reps=11):
    """Lower quartile of reps exchanges (_exchange) of nbytes with peer (both send at once,
    as a step of an exchange; point to point, no collective) after two warm-ups."""
    import time

    out, into = _pair_buffers(nbytes)
    times = []
    for i in range(reps + 2):
        t0 = time.perf_counter()
        _exchange(comm, out, peer, into, peer, 60)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 4]


def _pingpong_time(comm, peer, nbytes, reps=9):
    """Lower quartile of reps round trips of nbytes, rank 0 sending first and rank
    1 answering with as many (one copy at a time), halved: one way's time."""
    import time

    out, into = _pair_buffers(nbytes)
    times = []
    for i in range(reps + 2):
        t0 = time.perf_counter()
        if comm.rank == 0:
            comm.send(out, peer, timeout=60)
            comm.recv(into, peer, timeout=60)
        else:
            comm.recv(into, peer, timeout=60)
            comm.send(out, peer, timeout=60)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 4] / 2


def _oneway_curve(comm, alpha, sizes=BETA_SIZES):
    """((size, β), ...) of one copy at a time (ping-pong): β = (one way - α) / size."""
    curve = None
    if comm.rank < 2:
        curve = [(k, max(1e-12, (_pingpong_time(comm, 1 - comm.rank, k) - alpha) / k))
                 for k in sizes]
    return tuple(tuple(x) for x in comm.broadcast_obj(curve, 0))


def _beta_curve(comm, alpha, sizes=BETA_SIZES):
    """((size, β), ...): ranks 0 and 1 exchange each size, β = (time - α) / size;
    the others wait in the broadcast that spreads the figures."""
    curve = None
    if comm.rank < 2:
        curve = [(k, max(1e-12, (_exchange_time(comm, 1 - comm.rank, k) - alpha) / k))
                 for k in sizes]
    return tuple(tuple(x) for x in comm.broadcast_obj(curve, 0))


PATTERN_TAG = 0x5A17       # the chained pattern's messages (no collective uses it)


def _chained_lap(comm, pairs, a, b, hook=0):
    """A lap of the exchanges ``pairs`` as one exchange chain (transport/chain.pxi):
    one step per exchange, its send from a and its receive into b, as a
    prepared collective's steps wait (where ranks outnumber cores each step
    learns its own spin budget, transport.md "Waiting"); point to point, no
    collective's schedule.  hook: the receives combine into b as they land
    with this C loop (a reduce-receive).  The returned lap() runs it once."""
    k = a.nbytes
    steps = [([(1, dst, 0, 0, k, 0), (0, src, 2, 0, k, hook)], 0) for dst, src in pairs]
    chain = comm._exchange_chain(steps, b, 0, PATTERN_TAG, nbytes=k, itemsize=a.itemsize)
    chain.stamp(PATTERN_TAG << 40, 0, 120.0, 0xFFFFFFFF)
    seq = [0]

    def lap():
        seq[0] += 1
        if chain.go(a, seq[0]) != len(pairs):
            raise RuntimeError("the chained exchange pattern stopped short (a peer late "
                               "by 120 s or lost)")
    return lap


def _pattern_times(comm, pairs, sizes, target_s=0.12, batches=3, chained=False, land=False):
    """((size, seconds), ...): every rank at once runs its list of exchanges (_exchange)
    ``pairs`` ((dst, src), ...; point to point) with size-byte messages; the
    median over batches of the time per exchange, rank 0's (the ranks end
    within one exchange of each other).  chained: the lap as one exchange
    chain (_chained_lap), whose waits are the prepared collectives'; land:
    (chained) each receive combines float32 SUM as it lands."""
    import time

    import numpy as np

    r = comm.rank
    out = []
    hook = 0
    if land:
        from commrt.kernels import combine_address

        hook = combine_address("sum", np.dtype(np.float32))
    for k in sizes:
        dt, count = (np.float32, k // 4) if land else (np.uint8, k)
        a, b = _pair_buffers(k)
        a, b = a.view(dt), b.view(dt)

        if chained:
            lap = _chained_lap(comm, pairs, a, b, hook)
        else:
            def lap():
                for dst, src in pairs:
                    _exchange(comm, a, dst, b, src, 120)
        lap()
        comm.barrier()
        t0 = time.perf_counter()
        lap()
        est = time.perf_counter() - t0
        laps = comm.broadcast_obj(max(1, int(target_s / batches / max(est, 1e-6)))
                                  if r == 0 else None, 0)
        times = []
        for _ in range(batches):
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(laps):
                lap()
            times.append((time.perf_counter() - t0) / laps / len(pairs))
        out.append((k, sorted(times)[len(times) // 2]))
    return tuple(tuple(x) for x in comm.broadcast_obj(out if r == 0 else None, 0))


def _shift_times(comm, sizes=SHIFT_SIZES, chained=False):
    """The shift exchange (every rank at once sends to rank + d and receives from
    rank - d, d = 1..N-1 in turn): calibrate.fit_alpha turns it into the α the
    engine charges where ranks outnumber cores: the cost of all ranks waking,
    waiting and copying at once, which one message between two ranks alone
    does not show.  chained: the same exchanges as one exchange chain
    (_chained_lap), whose steps wait as a prepared collective's do (each
    learning its own spin where ranks outnumber cores); the plain one's
    waits are the general path's (they sleep after 50 µs)."""
    n, r = comm.size, comm.rank
    return _pattern_times(comm, [((r + d) % n, (r - d) % n) for d in range(1, n)], sizes,
                          chained=chained)


def _gamma_busy(comm, cores):
    """γ_mem with min(N, cores) ranks running the combine kernel at once (they
    share the memory bus in a collective's steps; the cost model's γ_mem is one
    rank's alone); rank 0's figure."""
    from commrt.collectives.cost import GAMMA_LARGE, _measure_gamma

    comm.barrier()
    g = _measure_gamma(GAMMA_LARGE, 5)[0] if comm.rank < min(comm.size, cores) else None
    return comm.broadcast_obj(g, 0)


NET_SIZES = (64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)
# below the smallest burst the harness gives a shaped link (_netns.Hosts: 32 KiB),
# headers included, so each goes through a full bucket at once
BURST_SIZES = (8, 8 << 10, 16 << 10, 24 << 10)
IDLE_S = 0.01       # before each of those: a bucket refills (36000 B at 100 Mbit/s: 2.9 ms)
CROSS_SIZES = (8, 64 << 10, 1 << 20, 4 << 20)       # every rank across the link at once
INNER_SIZES = (8 << 10, 64 << 10, 1 << 20, 4 << 20)  # every rank inside its host at once


def _pair_times(comm, pair, sizes, reps=5):
    """((size, seconds, CPU seconds), ...) of pair[0] exchanging each size with
    pair[1] (_exchange, lower quartile of reps; CPU: the process's, all its
    threads, per exchange, the median); the other ranks wait in the broadcast."""
    import time

    got = None
    if comm.rank in pair:
        peer = pair[1] if comm.rank == pair[0] else pair[0]
        got = []
        for k in sizes:
            out, into = _pair_buffers(k)
            walls, cpus = [], []
            for i in range(reps + 2):
                c0, t0 = time.process_time(), time.perf_counter()
                _exchange(comm, out, peer, into, peer, 120)
                if i >= 2:
                    walls.append(time.perf_counter() - t0)
                    cpus.append(time.process_time() - c0)
            got.append((k, sorted(walls)[len(walls) // 4], sorted(cpus)[len(cpus) // 2]))
    return tuple(tuple(x) for x in comm.broadcast_obj(got, pair[0]))


def _idle_pair_times(comm, pair, sizes, reps=15):
    """((size, seconds), ...) of pair[0] exchanging each size with pair[1] after
    both have left the link idle for IDLE_S (a shaped link's bucket full again),
    an 8-byte exchange just before lining the two up (the least of reps: waking
    from the idle sleep adds tens of microseconds at random, as much as the
    bytes' own time, and only ever adds); the other ranks wait in the broadcast."""
    import time

    import numpy as np

    got = None
    if comm.rank in pair:
        peer = pair[1] if comm.rank == pair[0] else pair[0]
        tick, tock = np.ones(8, np.uint8), np.zeros(8, np.uint8)
        got = []
        for k in sizes:
            out, into = _pair_buffers(k)
            walls = []
            for i in range(reps + 1):
                time.sleep(IDLE_S)
                _exchange(comm, tick, peer, tock, peer, 120)
                t0 = time.perf_counter()
                _exchange(comm, out, peer, into, peer, 120)
                if i:
                    walls.append(time.perf_counter() - t0)
            got.append((k, min(walls)))
    return tuple(tuple(x) for x in comm.broadcast_obj(got, pair[0]))


def burst_beta(pairs):
    """s/B of the bytes a full bucket lets through at once: the median of the
    slopes between every two of _idle_pair_times' figures (Theil-Sen; one noisy
    size moves a least-squares slope of four points to zero or below, and the
    median of six slopes not much)."""
    import statistics

    slopes = [(t1 - t0) / (k1 - k0) for i, (k0, t0) in enumerate(pairs)
              for k1, t1 in pairs[i + 1:] if k1 != k0]
    return max(0.0, statistics.median(slopes))


def hosts_calibration(comm):
    """The simulator's point-to-point figures across namespace hosts (every rank
    calls it; ``bench hosts``'s job with ``"sim": true`` in its spec): the
    exchange between the first two hosts' first ranks per size (β_net per size,
    and the CPU TCP's copies cost: net_cpu), the one between a host's first two
    ranks (β per size), the machine's cores, which every host shares, the
    general path's own work per call (_call_cost), and the first two hosts'
    exchange of messages under a shaped link's burst once it has been idle
    (β of the bytes a full bucket lets through: burst_beta)."""
    from commrt.collectives.cost import _cores, host_groups

    groups = host_groups(comm)
    net = _pair_times(comm, (groups[0][0], groups[1][0]), (8,) + NET_SIZES)
    burst = _idle_pair_times(comm, (groups[0][0], groups[1][0]), BURST_SIZES)
    local = next(((g[0], g[1]) for g in groups if len(g) > 1), None)
    shm = _pair_times(comm, local, (8,) + BETA_SIZES) if local else ()
    out = {"net": net, "shm": shm, "cores": _cores(), "call": _call_cost(comm),
           "burst": burst}
    n, h = comm.size, len(groups)
    if all(len(g) == len(groups[0]) for g in groups):   # the block placement sim models
        mine = next(g for g in groups if comm.rank in g)
        i, per = mine.index(comm.rank), len(mine)
        # every rank with its place on the next host / the next rank of its own
        cross = [((comm.rank + per) % n, (comm.rank - per) % n)] if h > 1 else []
        inner = [(mine[(i + 1) % per], mine[(i - 1) % per])] if per > 1 else []
        out["cross"] = _pattern_times(comm, cross, CROSS_SIZES) if cross else ()
        out["inner"] = _pattern_times(comm, inner, INNER_SIZES) if inner else ()
    return out


def _call_cost(comm, algo="ring", nbytes=64 << 10, reps=300):
    """Seconds of the general path's own work per all-reduce call (argument
    checks, the reducer, the Call, its wait for sends: what the validation's
    calls, which name their algorithm, run before and after their messages),
    timed on a one-rank communicator of each rank's own, where no message
    moves; the lower quartile of 5 batches, rank 0's."""
    import time

    import numpy as np

    import commrt.collectives as C

    alone = comm.split(comm.rank)
    buf = np.zeros(nbytes // 4, np.float32)
    for _ in range(20):
        C.all_reduce(alone, buf, "SUM", algo)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            C.all_reduce(alone, buf, "SUM", algo)
        times.append((time.perf_counter() - t0) / reps)
    alone.close()
    return comm.broadcast_obj(sorted(times)[1] if comm.rank == 0 else None, 0)


def _hop(comm):
    """µs of one hop of an 8-byte ring pass round every rank (bench p2p --ring's
    loop): a message's cost where the ranks outnumber the cores, each woken in turn."""
    from commrt.bench import _kernels
    from commrt.bench._p2p_commrt import ops_for

    got = _kernels.ring(ops_for(comm), target_s=0.5)
    return comm.broadcast_obj(got.get("ring_us_per_hop") if comm.rank == 0 else None, 0)


def _params_cores(comm):
    from commrt.bench._coll import bind
    from commrt.collectives.cost import _cores

    bind(comm.rank, comm.size)    # as the measured job's ranks are (bench allreduce)
    p = _params(comm)
    p["cores"] = _cores()
    p["gamma_busy"] = _gamma_busy(comm, p["cores"])
    p["call"] = _call_cost(comm)
    if comm.size == 2:   # the pair alone: with more ranks their waiting skews it
        p["beta_at"] = _beta_curve(comm, p["alpha"])
        p["oneway_at"] = _oneway_curve(comm, p["alpha"])
        peer = 1 - comm.rank
        plain = _pattern_times(comm, [(peer, peer)], BETA_SIZES, chained=True)
        p["beta_chain_at"] = tuple((k, max(1e-12, (t - p["alpha_plan"]) / k)) for k, t in plain)
        # the same with each receive combining as it lands: what that adds per byte
        landed = _pattern_times(comm, [(peer, peer)], BETA_SIZES, chained=True, land=True)
        p["land_at"] = tuple((k, max(0.0, (t - t0) / k))
                             for (k, t0), (_, t) in zip(plain, landed))
    if comm.size > p["cores"]:
        p["alpha_oversub"] = _hop(comm) * 1e-6
        p["shift"] = _shift_times(comm)
        p["shift_chain"] = _shift_times(comm, chained=True)
    return p


def calibrate(n, pair=None):
    """The simulator's parameters for n ranks on this host: the cost model's
    calibration of an n-rank job, the ring-pass hop and the shift exchange
    where n ranks outnumber the cores, the combine kernel under load, and the
    β curve of a two-rank job (``pair``: one measured before)."""
    from commrt.testing import World

    with World(n, env={"COMMRT_COST_CACHE": ""}, timeout=300) as w:
        p = w.run(_params_cores)[0]
    if "beta_at" not in p:
        pair = pair or calibrate(2)
        p["beta_at"], p["oneway_at"] = pair["beta_at"], pair["oneway_at"]
        p["beta_chain_at"] = pair["beta_chain_at"]
        p["land_at"] = pair.get("land_at", ())
    return p


def measure(n, sizes, algos, timeout=600):
    from commrt.bench import _peers as bench

    spec = {"kind": "all_reduce", "sizes": list(sizes), "algos": list(algos)}
    rows = bench.run_commrt(n, spec, "shm", timeout)["rows"]
    return {(row["algo"], row["bytes"]): row["time_s"] for row in rows}


# the model's terms, each switchable for the comparisons in docs/scale.md
TERMS = ("shift", "gamma_busy", "rendezvous", "call", "bus", "wait", "chain", "oneway", "land",
         "footprint", "crowd", "alone")
# those the validation uses: "bus" is measured and kept for comparison, but its
# one-way curve is the noisiest figure here (a 16 MiB ping-pong slower per copy
# than the exchange in some rounds), and it did not help (docs/scale.md)
DEFAULT_TERMS = ("shift", "gamma_busy", "rendezvous", "call", "wait", "chain", "oneway",
                 "land", "footprint", "crowd", "alone")


def _eager():
    from commrt import config

    return config.get("COMMRT_EAGER_LIMIT")


def topology(n, p, terms=DEFAULT_TERMS):
    """The one-node topology of n ranks with the calibration p: the cost model's
    α, β, γ, γ_mem; β per size; where ranks outnumber cores those cores, and α
    per size fitted to the shift exchange ("shift"; else the ring-pass hop);
    γ_mem of ranks combining at once ("gamma_busy"; with "alone", only for a
    combine while another rank of the node combines, γ_mem otherwise:
    Topology.gamma_busy); messages above the eager
    limit move once received and end their sender's call when taken
    ("rendezvous"); each rank's call costs its general path's own work first
    ("call"); a copy's β(s) is one copy's alone (ping-pong), and the rest of
    an exchange's, where both ranks copy at once, the node's memory taken one
    copy at a time ("bus"); where ranks outnumber cores α is a wait for a
    core, not work on one ("wait"); a message whose sender's core moves it
    too takes the ping-pong's β where ranks have a core each ("oneway";
    not with "bus", which takes that curve as every copy's own); where ranks
    outnumber cores, α grows with the ranks busy when a message is matched,
    those in their waiter's spin (COMMRT_OVERSUB_SPIN_US) or copying
    ("crowd": Topology.crowded)."""
    gmem, gbusy = p.get("gamma_mem"), None
    if "gamma_busy" in terms and p.get("gamma_busy"):
        if "alone" in terms:
            gbusy = p["gamma_busy"]
        else:
            gmem = max(gmem or 0.0, p["gamma_busy"])
    topo = Topology(1, n, p["alpha"], p["beta"], p["alpha"], p["beta"], p["gamma"],
                    p["segment"], cores=p["cores"] if n > p["cores"] else None,
                    gamma_mem=gmem, beta_at=tuple(map(tuple, p.get("beta_at", ()))),
                    alpha_oversub=p.get("alpha_oversub"),
                    eager=_eager() if "rendezvous" in terms else None,
                    call=p.get("call", 0.0) if "call" in terms else 0.0,
                    alpha_wait="wait" in terms, gamma_busy=gbusy)
    if "crowd" in terms:
        from commrt import config

        topo.crowd_spin = config.get("COMMRT_OVERSUB_SPIN_US") * 1e-6
    if "bus" in terms and p.get("oneway_at"):
        one = dict(map(tuple, p["oneway_at"]))
        both = [(k, b) for k, b in topo.beta_at if k in one]
        topo.beta_at = tuple((k, one[k]) for k, _ in both)
        # two copies at once take β_exchange per byte each: one's own β, plus
        # the other's share of the memory, which is the difference
        topo.bus_at = tuple((k, min(one[k], max(0.0, b - one[k]))) for k, b in both)
    if "oneway" in terms and p.get("oneway_at") and "bus" not in terms:
        topo.oneway_at = tuple(map(tuple, p["oneway_at"]))
    if "shift" in terms and p.get("shift") and topo.oversubscribed:
        from commrt.sim.calibrate import fit_alpha

        topo.alpha_at = tuple((k, fit_alpha(topo, k, t)) for k, t in p["shift"])
    return topo


def plan_alpha_at(topo, p, terms=DEFAULT_TERMS):
    """α per size for the steps of a prepared plan where ranks outnumber cores
    ("chain"): fitted, as ``shift`` is, to the shift exchange run as one
    exchange chain (its waits are the plans', learning their spin), or ()."""
    if "chain" not in terms or not p.get("shift_chain") or not topo.oversubscribed:
        return ()
    from commrt.sim.calibrate import fit_alpha

    return tuple((k, fit_alpha(topo, k, t)) for k, t in p["shift_chain"])


def plan_beta_at(topo, p, terms=DEFAULT_TERMS):
    """β per size for the messages of a prepared plan where each rank has a core
    ("chain"): the two-rank exchange run as a one-step exchange chain, many
    runs a timing (_pattern_times, as shift_chain), less α_plan; or ().  Where
    ranks outnumber cores the plans' α per size (plan_alpha_at) is fitted with
    the plain curve, which they keep."""
    if "chain" not in terms or not p.get("beta_chain_at") or topo.oversubscribed:
        return ()
    return tuple(map(tuple, p["beta_chain_at"]))


def predicted(n, nbytes, algo, p, topo=None, chain_at=None):
    topo = topo or topology(n, p)
    if chain_at is None:
        chain_at = plan_alpha_at(topo, p)
    topo = cell_topology(topo, algo, n, nbytes, FORCED_PLANS, p.get("alpha_plan", 0.0),
                         chain_at, plan_beta_at(topo, p))
    topo = land_topology(topo, algo, p, planned=planned(algo, n, nbytes, FORCED_PLANS))
    topo = sized(topo, n, nbytes)
    return simulate(topo,
                    schedules.steps_of(algo, n, max(1, nbytes // 4), ranks_per_node=n),
                    itemsize=4)


def sized(topo, local, nbytes, terms=DEFAULT_TERMS):
    """topo for a call of nbytes a rank: with ``footprint`` = nbytes ("footprint")
    where the buffers of a node's local ranks together reach its last-level
    cache, so that its shared-memory messages move no faster per byte than
    one of nbytes (Topology.b).  The cache is this machine's (the
    transport's sysfs figure, read once), where the runs were measured."""
    if "footprint" not in terms or local * nbytes < _cache_bytes():
        return topo
    return dataclasses.replace(topo, footprint=nbytes)


@functools.lru_cache(maxsize=None)
def _cache_bytes():
    from commrt.transport import last_cache_bytes

    return last_cache_bytes()


def land_topology(topo, algo, p, terms=DEFAULT_TERMS, planned=True):
    """topo with the calibration's land_at ("land": what combining as it lands adds
    to a receive's copy per byte, instead of γ) where the algorithm's combines
    are all reduce-receives: its module's LANDS, True (planned or not) or
    "plan" (planned: the cell ran on a prepared plan)."""
    lands = getattr(schedules.module(algo), "LANDS", False)
    if "land" not in terms or not p.get("land_at") or not lands \
            or (lands == "plan" and not planned):
        return topo
    return dataclasses.replace(topo, land_at=tuple(map(tuple, p["land_at"])))


def planned(algo, n, nbytes, forced_plans):
    """Whether the cell's calls ran on a prepared plan (runs saved with this
    forced_plans mark, FORCED_PLANS)."""
    from commrt.collectives import plans

    return bool(forced_plans and forced_plans >= PLANNED_SINCE.get(algo, 1)
                and plans.applies("all_reduce", algo, n, nbytes))


# Runs saved with this mark measured calls naming their algorithm on that
# algorithm's prepared plan where it has one (collectives._keyed_plan); the
# runs before it measured every forced algorithm on the general path.
FORCED_PLANS = 3
# algorithms whose plans came later than the mark's first value: a run saved with
# an older mark measured them on the general path (ps: 2, 2026-12-04; dbtree: 3,
# 2026-12-05)
PLANNED_SINCE = {"ps": 2, "dbtree": 3}


def cell_topology(topo, algo, n, nbytes, forced_plans, alpha_plan=0.0, chain_at=(),
                  beta_chain_at=()):
    """The topology of one cell.  A call that ran on a prepared plan pays none of
    the general path's own work ("call"), and its steps are the compiled
    chain's: with alpha_plan (the cost model's α_plan, a round of the barrier's
    plan with every rank at once: empty messages, point to point on the chain)
    a message's fixed cost is that instead of the Python exchanges' α; where
    ranks outnumber cores, α per size is chain_at (plan_alpha_at: the shift
    exchange on a chain) where it was measured, else the per-size part of the
    plain shift exchange's α (a large copy waiting for a core) on top of
    alpha_plan; β per size is beta_chain_at where given (plan_beta_at)."""
    if not planned(algo, n, nbytes, forced_plans):
        return topo
    topo = dataclasses.replace(topo, call=0.0)
    if alpha_plan:
        base = topo.alpha_at[0][1] if topo.alpha_at else 0.0
        topo = dataclasses.replace(
            topo, alpha_shm=alpha_plan,
            alpha_oversub=alpha_plan if topo.alpha_oversub else None,
            alpha_at=tuple(chain_at) if chain_at else
            tuple((k, alpha_plan + max(0.0, a - base)) for k, a in topo.alpha_at))
    if beta_chain_at:
        topo = dataclasses.replace(topo, beta_at=tuple(beta_chain_at))
    return topo


def _fast(work, log, wait):
    """hoststate.in_fast_state, waiting its default where wait is None."""
    from commrt.bench import hoststate

    return hoststate.in_fast_state(work, log, hoststate.FAST_WAIT_S if wait is None else wait)


def run(ranks, sizes, algos, rounds, log=print, params=None, wait=None):
    """{(n, algo, bytes): {"measured": [...], "simulated": [...]}}, one entry a
    round; params (a dict) receives each round's calibration, keyed (n, round),
    so that ``replay`` can simulate the same measurements again.  Each (n,
    round) is calibrated and measured in the host's fast state where it can
    be (``hoststate.in_fast_state``; its probes saved as the calibration's
    ``"host"``; wait=0: whatever the state, None: FAST_WAIT_S)."""
    data = {}
    params = {} if params is None else params
    for r in range(rounds):
        for n in ranks:
            runnable = []
            for algo in algos:
                try:
                    schedules.steps_of(algo, n, 1)
                    runnable.append(algo)
                except ScheduleError as exc:
                    log(f"  N={n} {algo}: not simulated ({exc})")
            if not runnable:
                continue

            def calibrated_and_measured():
                pair = calibrate(2)
                p = pair if n == 2 else calibrate(n, pair)
                return p, measure(n, sizes, runnable)
            (p, got), probes = _fast(calibrated_and_measured, log, wait)
            p["host"] = probes
            params[(n, r)] = p
            topo = topology(n, p)
            chain_at = plan_alpha_at(topo, p)
            for algo in runnable:
                for k in sizes:
                    cell = data.setdefault((n, algo, k), {"measured": [], "simulated": []})
                    cell["measured"].append(got[(algo, k)])
                    cell["simulated"].append(predicted(n, k, algo, p, topo, chain_at))
        log(f"  round {r + 1}/{rounds} done")
    return data


def replay_groups(files):
    """[(across hosts, files)]: one-host runs first, then runs across hosts (their
    cells are keyed by N and by link rate, and reported apart)."""
    groups = {}
    for path in files:
        with open(path) as f:
            groups.setdefault(bool(json.load(f).get("hosts")), []).append(path)
    return sorted(groups.items())


def replay(files, terms=None, params=None):
    """The cells of saved runs (``--json``) simulated again with the calibration
    saved beside them: the model changes, the measurements are the same.
    terms: the model's terms to use (None: the validation's, DEFAULT_TERMS, or
    DEFAULT_HOST_TERMS for runs across hosts).  params (a dict) receives each
    round's calibration keyed as the returned cells count their rounds (the
    files' rounds one after another), for ``steady``."""
    data = {}
    params = {} if params is None else params
    for path in files:
        with open(path) as f:
            saved = json.load(f)
        hosts = saved.get("hosts")
        use = (DEFAULT_HOST_TERMS if hosts else DEFAULT_TERMS) if terms is None else terms
        before = {}     # rounds of each N (or link) in the files read before this one
        for key, p in saved["params"].items():
            first, r = key.split("|")
            first = first if hosts else int(first)
            before.setdefault(first, sum(1 for seen, _ in params if seen == first))
            params[(first, before[first] + int(r))] = p
        for key, cell in saved["cells"].items():
            first, algo, k = key.split("|")
            k = int(k)
            out = data.setdefault((first if hosts else int(first), algo, k),
                                  {"measured": [], "simulated": []})
            for r, m in enumerate(cell["measured"]):
                p = saved["params"][f"{first}|{r}"]
                if hosts:
                    local = saved["local"]
                    topo = hosts_topology(hosts, local, p, use)
                    n = hosts * local
                else:
                    n, local = int(first), int(first)
                    topo = topology(n, p, use)
                chain_at = () if hosts else plan_alpha_at(topo, p, use)
                beta_chain = () if hosts else plan_beta_at(topo, p, use)
                out["measured"].append(m)
                # (α_plan, a round of the barrier's plan, is a one-host figure: across
                # hosts it is a network round, and run_hosts leaves it out too)
                topo = cell_topology(topo, algo, n, k, saved.get("forced_plans"),
                                     0.0 if hosts else p.get("alpha_plan", 0.0), chain_at,
                                     beta_chain)
                if not hosts:
                    topo = land_topology(topo, algo, p, use,
                                         planned(algo, n, k, saved.get("forced_plans")))
                topo = sized(topo, local, k, use)
                out["simulated"].append(in_a_loop(topo, schedules.steps_of(
                    algo, n, max(1, k // 4), ranks_per_node=local)))
    return data


def within(data, tol=0.25):
    """(cells whose median sim/measured is within tol, cells)."""
    ok = 0
    for cell in data.values():
        ratio = Summary([b / a for a, b in zip(cell["measured"], cell["simulated"])]).median
        ok += abs(ratio - 1) <= tol
    return ok, len(data)


def is_steady(p):
    """Whether a round's calibration and measurement both ran in the host's fast
    state: its host-state probes (p["host"], before the calibration and after
    the measurement) both said fast.  A round saved without probes counts
    (the runs before they existed)."""
    from commrt.bench import hoststate

    return "host" not in p or hoststate.steady(p["host"])


def steady(data, params):
    """(data with only its steady rounds, rounds kept, rounds in all): params
    {(first, round): calibration}, cells {(first, algo, bytes): ...} whose i-th
    entry is round i.  A cell left with no round is dropped.  Why: this host
    (a VM) flips between a fast state and one where shared-memory streams
    crawl 10x (``bench hoststate``); a round calibrated in one and measured
    in the other tests the host, not the model."""
    keep = {key: is_steady(p) for key, p in params.items()}
    out = {}
    for (first, algo, k), cell in data.items():
        rounds = [i for i in range(len(cell["measured"])) if keep.get((first, i), True)]
        if rounds:
            out[(first, algo, k)] = {name: [cell[name][i] for i in rounds]
                                     for name in ("measured", "simulated")}
    return out, sum(keep.values()), len(keep)


def summary_lines(data, params):
    """The validation's count, of the steady rounds and of all of them."""
    kept, good, total = steady(data, params)
    lines = ["within 25%%: %d of %d cells" % within(kept)
             + (f" (rounds in the fast state at both ends: {good} of {total})"
                if good < total else "")]
    if good < total:
        lines.append("all rounds, the host's state aside: %d of %d cells" % within(data))
    return lines


def run_hosts(hosts, local, rates, sizes, algos, rounds, log=print, params=None,
              wait=None):
    """The same across namespace hosts: {(rate, algo, bytes): {...}}; params (a
    dict) receives each job's calibration, keyed (rate, round)."""
    import os
    import tempfile

    from commrt.bench import _netns
    from commrt.bench.hosts import run_commrt

    n = hosts * local
    runnable = []
    for algo in algos:
        try:
            schedules.steps_of(algo, n, 1)
            runnable.append(algo)
        except ScheduleError as exc:
            log(f"  {algo}: not simulated ({exc})")
    spec = {"kind": "all_reduce", "sizes": list(sizes), "algos": runnable, "sim": True}
    data = {}
    params = {} if params is None else params
    with _netns.Hosts(hosts, mtu=9000) as h:
        for rate in rates:
            h.set_rate(rate)
            for r in range(rounds):
                def job():
                    with tempfile.TemporaryDirectory(prefix="commrt-sim-validate-") as tmp:
                        os.chmod(tmp, 0o755)
                        return run_commrt(h, local, spec, tmp, 600)
                res, probes = _fast(job, log, wait)
                link = {"rate": _netns.rate_bytes(rate), "burst": _netns.size_bytes(h.burst)}
                p = dict(res["params"], sim=res.get("sim"), link=link, host=probes)
                params[(rate, r)] = p
                topo = hosts_topology(hosts, local, p)
                for row in res["rows"]:
                    k, algo = row["bytes"], row["algo"]
                    cell = data.setdefault((rate, algo, k), {"measured": [], "simulated": []})
                    cell["measured"].append(row["time_s"])
                    cell["simulated"].append(in_a_loop(
                        sized(cell_topology(topo, algo, n, k, FORCED_PLANS), local, k,
                              DEFAULT_HOST_TERMS),
                        schedules.steps_of(algo, n, max(1, k // 4), ranks_per_node=local)))
                log(f"  {rate}: round {r + 1}/{rounds} done")
    return data


def in_a_loop(topo, steps_of):
    """A call's simulated time as the validation's loop of calls sees it: where a
    token bucket shapes the links, the second of two calls (the first finds
    every bucket full, a loop's calls find them as the call before left them)."""
    return simulate(topo, steps_of, itemsize=4, calls=2 if topo.link_rate else 1)


HOST_TERMS = ("machine_cores", "net_curve", "net_cpu", "shm_curve", "rendezvous", "call",
              "bucket", "busy_shm", "busy_net", "footprint")
# those the validation uses: busy_shm and busy_net are measured and kept for
# comparison (docs/scale.md): neutral and worse (30 of 48 cells against 38)
DEFAULT_HOST_TERMS = HOST_TERMS[:7] + ("footprint",)


def _curve(pairs, alpha):
    """((size, β), ...) from ((size, seconds, cpu), ...): β = (t - α) / size."""
    return tuple((k, max(1e-12, (t - alpha) / k)) for k, t, _ in pairs if k > 8)


def hosts_topology(hosts, local, p, terms=DEFAULT_HOST_TERMS):
    """The namespace hosts' topology from their job's calibration p (the cost
    model's α, β, γ of both link classes) and, where the job ran
    hosts_calibration (p["sim"]), the point-to-point terms: the machine's cores
    shared by every host ("machine_cores"), β_net per size ("net_curve"), TCP's
    copies on those cores ("net_cpu": the process time per byte of the leaders'
    exchange, its waiting included), β per size inside a host ("shm_curve");
    messages above the eager limit move once received ("rendezvous"), each
    call's own work ("call"), the links' token buckets ("bucket": tc's rate
    and burst, p["link"], with the β of a burst's bytes measured after the
    link was idle, burst_beta); and, fitted through the engine to every rank
    exchanging at once, α per size inside a host where the machine's ranks
    outnumber its cores ("busy_shm": every rank with its host's next) and α_net
    and β_net per size ("busy_net": every rank with its place on the next host)."""
    sim = p.get("sim") or {}
    topo = Topology(hosts, local, p["alpha"], p["beta"], p["alpha_net"], p["beta_net"],
                    p["gamma"], p["segment"],
                    cores=p["cores"] if local > p["cores"] else None,
                    gamma_mem=p.get("gamma_mem"),
                    eager=_eager() if "rendezvous" in terms else None)
    if not sim:
        return topo
    if "machine_cores" in terms and hosts * local > sim["cores"]:
        topo.cores, topo.shared_cores = sim["cores"], True
    net = sim["net"]
    if "net_curve" in terms:
        topo.alpha_net = net[0][1]
        topo.beta_net_at = _curve(net, net[0][1])
    if "net_cpu" in terms:
        big, small = net[-1], net[0]
        topo.net_cpu = max(0.0, (big[2] - small[2]) / (big[0] - small[0]))
    if "call" in terms:
        topo.call = sim.get("call", 0.0)
    if "bucket" in terms and p.get("link") and sim.get("burst"):
        topo.link_rate, topo.link_burst = p["link"]["rate"], p["link"]["burst"]
        topo.beta_burst = burst_beta(sim["burst"])
    if "shm_curve" in terms and sim["shm"]:
        topo.alpha_shm = sim["shm"][0][1]
        topo.beta_at = _curve(sim["shm"], sim["shm"][0][1])
    from commrt.sim.calibrate import fit_pattern, pattern_steps

    n = hosts * local
    if "busy_shm" in terms and sim.get("inner") and topo.oversubscribed and local > 1:
        def inner(r):
            base, i = r - r % local, r % local
            return [(base + (i + 1) % local, base + (i - 1) % local)]
        base = dataclasses.replace(topo, alpha_at=((1, 0.0),))
        topo.alpha_at = tuple((k, fit_pattern(base, "alpha_at", pattern_steps(n, inner, k), 1,
                                              t)) for k, t in sim["inner"])
    if "busy_net" in terms and sim.get("cross") and hosts > 1:
        def cross(r):
            return [((r + local) % n, (r - local) % n)]
        (k0, t0), rest = sim["cross"][0], sim["cross"][1:]
        topo.alpha_net = fit_pattern(topo, "alpha_net", pattern_steps(n, cross, k0), 1, t0)
        base = dataclasses.replace(topo, beta_net_at=((1, topo.beta_net),))
        topo.beta_net_at = tuple((k, fit_pattern(base, "beta_net_at", pattern_steps(
            n, cross, k), 1, t)) for k, t in rest)
    return topo


def report(data, first="N"):
    rows = []
    for (n, algo, k), cell in sorted(data.items()):
        m, s = Summary(cell["measured"]), Summary(cell["simulated"])
        ratio = Summary([b / a for a, b in zip(cell["measured"], cell["simulated"])])
        rows.append([str(n), algo, fmt_size(k), f"{m.median * 1e6:.1f}", f"{s.median * 1e6:.1f}",
                     ratio.cell()])
    return table([first, "algorithm", "size", "measured us", "simulated us", "sim/measured"],
                 rows, "llrrrr")


def _print(data, params, first):
    """The table of the steady rounds (``steady``) and the counts."""
    print(report(steady(data, params)[0], first))
    for line in summary_lines(data, params):
        print(line)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m commrt.sim validate",
                                description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="2,4,8")
    p.add_argument("--sizes", default="64K,1M,16M")
    p.add_argument("--algos", default=None,
                   help="default: every all-reduce algorithm with a schedule")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hosts", type=int, help="namespace hosts instead of one (root)")
    p.add_argument("--ranks-per-host", type=int, default=2)
    p.add_argument("--rates", default="1gbit,10gbit")
    p.add_argument("--json")
    p.add_argument("--any-state", action="store_true",
                   help="run each round at once, whatever the host's state (default: wait "
                   "for its fast state, run a round again where it changed; bench hoststate)")
    p.add_argument("--replay", nargs="+", metavar="JSON",
                   help="simulate the cells of saved runs (--json) again, measuring nothing")
    p.add_argument("--terms", default="all",
                   help="with --replay: the model's terms to use (of " + ",".join(TERMS)
                   + ", or across hosts " + ",".join(HOST_TERMS)
                   + "; 'none': the model before them)")
    args = p.parse_args(argv)
    if args.replay:
        terms = (None if args.terms == "all" else () if args.terms == "none"
                 else tuple(args.terms.split(",")))
        for across, files in replay_groups(args.replay):
            params = {}
            data = replay(files, terms, params)
            _print(data, params, "link" if across else "N")
        return 0
    algos = (args.algos.split(",") if args.algos else
             [a for a in schedules.names() if schedules.has_schedule(a)
              and (args.hosts or a not in MULTI_HOST)])
    sizes = [parse_size(x) for x in args.sizes.split(",")]
    if args.hosts:
        params = {}
        data = run_hosts(args.hosts, args.ranks_per_host, args.rates.split(","), sizes,
                         algos, args.rounds, params=params,
                         wait=0 if args.any_state else None)
        print(f"{args.hosts} namespace hosts x {args.ranks_per_host} ranks")
        _print(data, params, "link")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"hosts": args.hosts, "local": args.ranks_per_host,
                           "forced_plans": FORCED_PLANS,
                           "cells": {f"{n}|{a}|{k}": v for (n, a, k), v in data.items()},
                           "params": {f"{n}|{r}": p for (n, r), p in params.items()}},
                          f, indent=1)
        return 0
    else:
        ranks = [int(x) for x in args.ranks.split(",")]
        params = {}
        data = run(ranks, sizes, algos, args.rounds, params=params,
                   wait=0 if args.any_state else None)
        _print(data, params, "N")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"forced_plans": FORCED_PLANS,
                           "cells": {f"{n}|{a}|{k}": v for (n, a, k), v in data.items()},
                           "params": {f"{n}|{r}": p for (n, r), p in params.items()}},
                          f, indent=1)
        return 0


if __name__ == "__main__":
    sys.exit(main())
