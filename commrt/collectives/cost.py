"""The α-β-γ cost model that picks algorithms, with parameters measured per transport.

    α       seconds of one step of an exchange between two ranks (post a
            receive, send, wait, check), measured as the collectives run it
    α_busy  one step of an 8-byte recursive doubling run by every rank at
            once: with more ranks than cores each step also waits for a
            context switch (N = 4 on 2 cores: 12-37 µs against 2-10 µs)
    β       seconds per byte received (on shared memory the receiver copies:
            process_vm_readv), from a 1 MiB exchange less α
    γ       seconds per byte reduced by the C combine loop (float32 sum, 1 MiB: in
            cache); γ_mem the same on 16 MiB (from memory); ``g(chunk)``
            goes from one to the other with the size reduced at once
    μ       seconds per byte of a local copy (memcpy)
    α_net, β_net  α and β of the network class: a step between ranks on
            different hosts (0 on one host).  α, β are the shared-memory
            class's where some host holds two ranks, else the network's.
    α_plan  one round of the dissemination barrier's prepared plan, every rank at
            once: the α and α_busy of a step of an algorithm that runs on a
            plan at that size (one host).
    c_gen   seconds the general path adds to a call (its Call, checks and the
            Python between steps), every rank calling at once: an 8-byte
            recursive doubling made of fresh calls, less the same steps run
            inside one, and at least its CPU alone times ranks per core.
            Charged to the algorithms that have no prepared plan at that
            size (plans.applies): 3 µs a call at N = 2 here, 5-60 µs where
            ranks outnumber cores.

Link classes.  On several hosts a flat algorithm (ring, tree, Rabenseifner,
...) runs in lockstep, so its steps go at the network's pace: it is costed
with ``params.net(share)``, α_net and β_net with β_net times ``share``, the
ranks of one host that cross the network at once through its one NIC (the
ring's block placement sends one stream per host and direction: 1; the
others: the ranks on a host).  The hierarchical all-reduce costs its steps
inside a host with α, β and its ring among the leaders with ``net()``.

Every algorithm module has ``cost(n, nbytes, params, comm=None)``, written from what
its code does (see its docstring and docs/algorithms.md) in three parts:
lat, the α terms of its critical path; crit, the byte terms of that path;
work, the byte terms summed over all ranks.  ``params.time`` is lat + crit,
or lat + max(crit, work / cores) when ranks outnumber cores (then α is
α_busy, ``step``).  A segment of a pipelined step after the first costs α
(its own message), except in the ring, whose every segment waits on a
neighbour.  ``nseg`` and ``rho`` (a cruder oversubscription factor) serve
the other collectives' models.

Measurement (``calibrate``, a collective, once per communicator family;
20-60 ms on this host, most of it γ_mem's 32 MiB): two ranks of one host
exchange 8 B and 1 MiB (α, β), then on several hosts rank 0 and the first
rank of the next host (α_net, β_net); every rank runs 8-byte recursive
doubling (α_busy),
rank 0 times the C combine loop on 1 and 16 MiB and a 1 MiB copy (γ, γ_mem, μ) and
broadcasts the numbers so every rank picks the same algorithm.  They are
cached in COMMRT_COST_CACHE per (transports, hostname, network namespace
and interface, cores, ranks on the host, hosts), so later jobs skip the
measurement once the entry has settled: until two quiet measurements
agree (their α, β, α_busy, c_gen and α_plan within 1.5x; or four were taken),
each job measures again and the entry keeps each field's smaller value
(``_merge``).  Samples that spread the way a busy host spreads them are
used by their job (merged with the entry) but not stored.
COMMRT_<COLLECTIVE>_ALGO overrides a collective's choice.

The earlier model took α from an idle ping-pong and scaled oversubscribed
steps by N/cores: its choice was 16-36% slower than the best fixed
algorithm on a quiet host (docs/performance-collectives.md).
"""
import json
import math
import os
import socket
import time
from dataclasses import asdict, dataclass, replace

from commrt import _lazy

from commrt import config
from commrt.collectives import tuning
from commrt.rendezvous import netif
np = _lazy.module("numpy", globals(), "np")   # loaded on first use (a barrier needs none)


# 11: α_plan; 10: c_gen has a CPU floor; 9: c_gen (the general path's own cost
# per call); 8: measured once every rank has arrived (α and α_busy of 7 could include ranks
# still loading their modules: α 73 µs at N = 8 on 2 cores, 2.8 µs after);
# 7: γ of the C combine loop, not Numba's; 6: the network class (α_net, β_net) and
# the link in the key; 5: shm streams in 64 KiB chunks (β changed); 4: below
# COMMRT_CMA_MIN_BYTES streams
CACHE_VERSION = 11
GAMMA_SMALL, GAMMA_LARGE = 1 << 20, 16 << 20   # sizes γ and γ_mem are measured at
NOISY = 3.0   # α's lower quartile over its fastest sample beyond which the host was busy


@dataclass
class Params:
    alpha: float
    beta: float
    gamma: float
    mu: float = 0.0
    alpha_busy: float = 0.0
    gamma_mem: float = 0.0  # γ of a reduction too large for the caches (0: as γ)
    segment: int = 1 << 20
    cores: int = 1
    local: int = 1          # most ranks on one host
    transport: str = "shm"
    source: str = "measured"
    alpha_net: float = 0.0
    beta_net: float = 0.0
    hosts: int = 1
    call: float = 0.0       # c_gen: what the general path adds to a call without a plan
    alpha_plan: float = 0.0  # α of a step of a prepared plan's chain (0: not measured)

    def net(self, share=1):
        """The parameters of a step across hosts, ``share`` ranks of a host sending
        through its NIC at once (self on one host)."""
        if self.hosts <= 1 or not self.beta_net:
            return self
        return replace(self, alpha=self.alpha_net, beta=self.beta_net * max(1, share),
                       alpha_busy=max(self.alpha_busy, self.alpha_net))

    def nseg(self, nbytes):
        return max(1, math.ceil(nbytes / self.segment))

    def rho(self, n_active):
        return max(1.0, min(n_active, self.local) / self.cores)

    def g(self, chunk):
        """γ of reductions done chunk bytes at a time: γ up to GAMMA_SMALL (in cache),
        γ_mem from GAMMA_LARGE (memory), geometric in between."""
        if chunk <= GAMMA_SMALL or self.gamma_mem <= self.gamma:
            return self.gamma
        if chunk >= GAMMA_LARGE:
            return self.gamma_mem
        f = math.log(chunk / GAMMA_SMALL) / math.log(GAMMA_LARGE / GAMMA_SMALL)
        return self.gamma * (self.gamma_mem / self.gamma) ** f

    def oversubscribed(self, n_active):
        return min(n_active, self.local) > self.cores

    def step(self, n_active):
        """α of a step in which n_active ranks exchange at once."""
        if self.oversubscribed(n_active):
            return max(self.alpha, self.alpha_busy)
        return self.alpha

    def time(self, n_active, lat, crit, work):
        """lat (the α terms of the critical path) plus its byte terms crit, or plus
        the work of all ranks spread over the cores when n_active ranks share
        fewer cores (whichever is longer)."""
        if self.oversubscribed(n_active):
            return lat + max(crit, work / self.cores)
        return lat + crit


def _cores():
    """Cores the job's ranks on this host share: the union of their affinity masks
    as the transport found them (connect.host_cores); before any job, this
    rank's mask, unless it is one core (a rank pinned to its own core still
    shares the host's cores with the others)."""
    from commrt.transport.connect import host_cores

    known = host_cores()
    if known:
        return known
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = 1
    return n if n > 1 else (os.cpu_count() or 1)


def _cache_path():
    path = config.get("COMMRT_COST_CACHE")   # set and empty: None, measure every job
    return os.path.expanduser(path) if path else None


def _cache_key(transport, local, hosts=1):
    link = netif.link_key(config.get("COMMRT_IFNAME"))
    return f"{transport}:{socket.gethostname()}:{link}:{_cores()}:{local}:{hosts}"


FIELDS = ("alpha", "beta", "gamma", "mu", "alpha_busy", "gamma_mem", "alpha_net", "beta_net",
          "call", "alpha_plan")


def _load(transport, local, hosts=1):
    """The cached entry: (values, samples, settled), or None."""
    path = _cache_path()
    if not path:
        return None
    try:
        with open(path) as f:
            entry = json.load(f).get(_cache_key(transport, local, hosts))
        if entry is None or entry.get("version") != CACHE_VERSION:
            return None
        return (tuple(float(entry[k]) for k in FIELDS), int(entry.get("samples", 1)),
                bool(entry.get("settled", False)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def read_cache():
    """(path, {key: entry}) of the cost cache: every entry, the calibrations' and
    the tuned winners' (collectives/tuning.py); (None, {}) when disabled."""
    path = _cache_path()
    if not path:
        return None, {}
    try:
        with open(path) as f:
            data = json.load(f)
        return path, data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return path, {}


def write_cache(path, data):
    """Replace the cost cache with data at once (a cache that cannot be written
    is only not kept)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass


def _store(transport, local, values, hosts=1, samples=1, settled=False):
    path, data = read_cache()
    if not path:
        return
    entry = dict(zip(FIELDS, (float(v) for v in values)))
    entry.update(version=CACHE_VERSION, when=time.time(), samples=samples, settled=settled)
    data[_cache_key(transport, local, hosts)] = entry
    write_cache(path, data)


# The cache settles once two measurements agree: a job that finds an unsettled
# entry measures again and keeps each field's smaller value (load only ever
# slows a step down).  A first measurement taken in a slow state of the host,
# with every sample equally slow, passes the spread test (NOISY) yet was kept
# for good before: on 2026-12-04 an N = 2 entry with α 36 µs (3 µs quiet) made
# auto take the ring reduce at 1 MiB, 1.9x slower than binomial.  β agrees too:
# at N = 2 it swings 3x with the host's state while the latencies do not
# (1.7e-10 and 4.8-5.0e-10 s/B in three fresh calibrations within a minute,
# 2026-12-06), and it sets the choice from a few MiB up.
AGREE = 1.5            # the settling fields of two measurements within this factor agree
SETTLE_AFTER = 4       # measurements after which the entry settles whatever they were
_AGREEING = ("alpha", "beta", "alpha_busy", "call", "alpha_plan")


def _merge(prior, measured):
    """(values, samples, settled) after a quiet measurement, given the unsettled
    cached entry prior ((values, samples, settled) or None)."""
    if prior is None:
        return tuple(measured), 1, False
    values, samples, _ = prior
    merged = tuple(min(a, b) if a > 0 and b > 0 else max(a, b) for a, b in zip(values, measured))
    agree = all(max(a, b) <= AGREE * min(a, b)
                for k, a, b in zip(FIELDS, values, measured) if k in _AGREEING and a > 0 and b > 0)
    return merged, samples + 1, agree or samples + 1 >= SETTLE_AFTER


def _exchange(call, peer, nbytes, iters):
    """Time of one exchange step with peer (both send nbytes at once, as a step of
    recursive doubling or Rabenseifner does): post the receive, send, wait for
    both.  The lower quartile: a loaded host stalls now and then, and stalls
    caused by other jobs must not set the model (or its cache)."""
    out = np.zeros(max(1, nbytes), np.uint8)
    into = np.zeros(max(1, nbytes), np.uint8)
    times = []
    for i in range(iters + 2):
        t0 = time.perf_counter()
        rv = call.irecv(into, peer)
        call.isend(out, peer)
        call.wait(rv)
        call.wait_sends()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 4], times[0]


def _rd_steps(n):
    from commrt.collectives.all_reduce import _fold
    p2, rem = _fold.plan(n)
    return int(math.log2(p2)) + (2 if rem else 0)


def _fresh_call(call):
    """A Call and a reducer as the general path makes them for a user's call, on
    the calibration's sequence number (resumed: nothing consumed or recorded).
    Its fingerprint is the calibration's own: a rank waiting in it past the probe
    interval probes its peers with that fingerprint, and a peer takes any other
    at this sequence number for a mismatch (call.check_probes)."""
    from commrt.collectives.call import Call
    from commrt.collectives.reduction import Reduction

    f64 = np.dtype(np.float64)
    c = Call(call.comm, "calibrate", count=call.count, dtype=f64, algo="binomial",
             seq=call.seq, timeout=call.timeout)
    c.deadline = call.deadline
    return c, Reduction(None, "sum", f64, False)


def _rd_times(call, iters):
    """(inside, fresh): seconds of 8-byte recursive-doubling all-reduces run
    by every rank at once, alternately inside `call` and each as a call of its
    own, with the Call, fingerprint and reducer the general path makes for a
    user's call (its sequence number the calibration's: nothing is consumed or
    recorded).  Alternated, so that a slow spell of the host hits both."""
    from commrt.collectives.all_reduce import recursive_doubling
    from commrt.collectives.reduction import Reduction

    buf = np.zeros(1, np.float64)
    add = Reduction(None, "sum", np.dtype(np.float64), False)
    inside, fresh = [], []
    for i in range(2 * iters + 4):
        t0 = time.perf_counter()
        c, red = _fresh_call(call) if i & 1 else (call, add)
        recursive_doubling.run(c, buf, red)
        c.wait_sends()
        if i >= 4:
            (fresh if i & 1 else inside).append(time.perf_counter() - t0)
    return inside, fresh


def _general_cpu(call, reps=200):
    """Seconds of CPU the general path spends on a call before and after its
    messages (a fresh Call with its fingerprint, a reducer, the wait for its
    sends), timed on this rank alone: no message moves, so no other rank's
    scheduling enters it (the lower quartile of reps)."""
    times = []
    for _ in range(reps):
        t0 = time.thread_time()     # CPU: the other ranks share the cores meanwhile
        c, _ = _fresh_call(call)
        c.wait_sends()
        times.append(time.thread_time() - t0)
    times.sort()
    return times[reps // 4]


def _busy_step(call, local, iters=40):
    """(α_busy, c_gen).  α_busy: time of one step of an 8-byte recursive-doubling
    all-reduce run by every rank at once (the lower quartile, over the steps it
    takes, as rank 0 sees it).  c_gen: the median over adjacent pairs of the
    same all-reduce made a fresh call less one run inside this call, and at
    least the general path's own CPU (_general_cpu) times the ranks per core
    where they outnumber the cores (ranks in lockstep: every µs one spends
    costs that many µs of wall, docs/torch.md).  The pairs alone came out
    anywhere from 0 to 10x between calibrations where ranks outnumber cores."""
    inside, fresh = _rd_times(call, iters)
    busy = sorted(inside)[len(inside) // 4] / _rd_steps(call.size)
    diffs = sorted(f - i for f, i in zip(fresh, inside))
    if call.rank != 0:                  # rank 0's figures are the ones broadcast
        return busy, 0.0
    floor = _general_cpu(call) * max(1.0, local / _cores())
    return busy, max(floor, diffs[len(diffs) // 2])


def _plan_step(call, iters=40):
    """α_plan: seconds of one round of the dissemination barrier's prepared plan
    (the compiled chain every planned collective runs), every rank at once: the
    median over iters barriers, per round.  The barriers' sequence numbers
    and history entries are given back afterwards (every rank does the same),
    so the user's calls keep their numbers."""
    from commrt.collectives import _small

    comm, st = call.comm, call.state
    plan = st.small.get("barrier") or _small.prepare_barrier(comm, st)
    times = []
    with st.numbers_given_back():
        for i in range(iters + 4):
            t0 = time.perf_counter()
            _small.run(comm, st, plan.tmp, plan)
            if i >= 4:
                times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] / max(1, math.ceil(math.log2(comm.size)))


def _quartile_time(fn, reps=9):
    """(lower quartile, fastest) of reps timed calls after one untimed."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[reps // 4], times[0]


def _measure_gamma(nbytes=GAMMA_SMALL, reps=9):
    """γ of the C combine loop (float32 sum), the loop reduce-receives and the
    algorithms' own combines run (collectives/reduction.py)."""
    from commrt.kernels import combine_into

    a = np.zeros(nbytes // 4, np.float32)
    b = np.ones(nbytes // 4, np.float32)
    q, fastest = _quartile_time(lambda: combine_into(a, b, "sum"), reps)
    return q / a.nbytes, fastest / a.nbytes


def _measure_mu(nbytes=1 << 20):
    a = np.zeros(nbytes, np.uint8)
    b = np.ones(nbytes, np.uint8)
    return _quartile_time(lambda: np.copyto(a, b))[0] / nbytes


def _transport(comm):
    kinds = {comm.transport_of(q) for q in range(comm.size)} - {"self"}
    return "+".join(sorted(kinds)) or "self"


def host_groups(comm):
    """Ranks grouped by host, groups ordered by their lowest rank."""
    groups = {}
    for q in range(comm.size):
        groups.setdefault(comm.host_of(q), []).append(q)
    return sorted(groups.values())


def ranks_on_my_host(comm):
    """How many ranks of comm (a Communicator or its Channel) share this rank's host."""
    me = comm.host_of(comm.rank)
    return sum(1 for q in range(comm.size) if comm.host_of(q) == me)


def single_copy_min(comm=None):
    """The transport's single-copy threshold: comm's (Channel.cma_min; comm a
    Communicator or its Channel), or without one (a model's world with no
    transport) what COMMRT_CMA_MIN_BYTES gives a host whose ranks outnumber
    its cores."""
    from commrt.comm import Channel

    got = getattr(getattr(comm, "channel", comm), "cma_min", None)
    return Channel.default_cma_min(True) if got is None else got


def written_where_crowded(chan, cache, nbytes, otherwise):
    """The copier (Channel.irecv's) of a receive of nbytes whose sender posts its
    send at once and then only waits (a scatter's root, the peers of a direct
    all-gather or an all-to-all): Channel.SENDER where this host's ranks of
    the group outnumber its cores and the message is below the transport's
    single-copy threshold (chan.cma_min), else `otherwise`.  The sender,
    waiting for that very message, is on a core or soon will be, and writes
    it with process_vm_writev; a reading receiver must first get a core of
    its own while the sender waits for its FIN (2 cores, 2026-12-05: scatter
    N = 4 1 MiB 167-201 us read, 148-164 written; all-gather direct N = 4
    256 KiB 63-75 -> 47-48; all-to-all N = 4 1 MiB 373-457 -> 332-372;
    docs/performance-collectives.md).  From the threshold up the receiver
    reads, its sender's core copying half (a split read): writing alone was
    slower there.  Cached per communicator (cache: its state's)."""
    from commrt.comm import Channel

    return Channel.SENDER if _crowded(chan, cache) and nbytes < chan.cma_min else otherwise


def _crowded(chan, cache):
    crowded = cache.get("crowded")
    if crowded is None:
        crowded = cache["crowded"] = ranks_on_my_host(chan) > _cores()
    return crowded


def exchange_half(chan, cache, who, recv_nbytes, send_nbytes):
    """The copier of a receive that is half of an exchange with one peer (it gets
    recv_nbytes while we send it send_nbytes), given its copier who as the
    receive alone would have it.  With a core per rank the transport reads an
    exchange's half from a quarter of the single-copy threshold up and streams
    the smaller (shm.pxi read_early): unequal halves on either side of that
    size would be copied one each way, the read waiting on a core that also
    streams (all_gatherv N = 2, blocks 512 KiB and 4 B less: 74-83 us, against
    56-58 both read and ~40 both streamed).  Both are streamed then: 0, the
    transport's choice, which streams both below the threshold."""
    from commrt.comm import Channel

    if who != Channel.EXCHANGE or _crowded(chan, cache):
        return who
    big, read_from = max(recv_nbytes, send_nbytes), chan.cma_min // 4
    if big >= chan.cma_min or min(recv_nbytes, send_nbytes) >= read_from or big < read_from:
        return who
    return 0


def _pairs(groups):
    """(shared-memory pair or None, network pair or None) that calibrate measures:
    the first two ranks of the first host holding two, and rank 0 with the first
    rank of the second host."""
    local = next(((g[0], g[1]) for g in groups if len(g) > 1), None)
    net = (groups[0][0], groups[1][0]) if len(groups) > 1 else None
    return local, net


def _measure_pair(call, pair, vals, slot):
    """The pair exchanges 8 B and 1 MiB; its lower rank broadcasts (α, β) into
    vals[slot:slot + 2].  Returns whether the samples looked quiet."""
    from commrt.collectives.broadcast import binomial as _bcast

    r, quiet = call.rank, True
    if r in pair:
        peer = pair[1] if r == pair[0] else pair[0]
        alpha, fastest = _exchange(call, peer, 8, 30)
        _, big = _exchange(call, peer, 1 << 20, 15)  # the fastest: others only slow it
        # Other jobs on the host spread the samples: use the numbers for
        # this job, but do not cache them for every later one.
        quiet = alpha < NOISY * fastest
        if r == pair[0]:
            vals[slot:slot + 2] = (alpha, max(1e-12, (big - alpha) / (1 << 20)))
    _bcast.run(call, vals, pair[0])  # also keeps the other ranks out of the way
    call.wait_sends()
    return quiet


def params(comm, timeout=None, serving=None):
    """The cost parameters of comm (a collective the first time on a communicator
    family: every rank must call it at the same point, as they do when they all
    call a collective with algorithm=None)."""
    from commrt.collectives.call import Call
    from commrt.collectives.state import execute, state_of

    c = comm.channel                    # this communicator, then those it came from
    while c is not None:
        p = state_of(c).cache.get("cost")
        if p is not None:
            if c is not comm.channel:
                state_of(comm).cache["cost"] = p
            return p
        c = c.parent
    if comm.size == 1:
        p = Params(0.0, 0.0, _measure_gamma()[0], _measure_mu(), cores=_cores(),
                   transport="self", source="size 1")
        state_of(comm).cache["cost"] = p
        return p
    transport = _transport(comm)
    groups = host_groups(comm)
    local, hosts = max(len(g) for g in groups), len(groups)
    shm_pair, net_pair = _pairs(groups)
    call = Call(comm, "calibrate", count=1 + len(FIELDS), dtype=np.float64, algo="binomial",
                timeout=timeout, serving=serving)
    from commrt.collectives.barrier import dissemination as _dissemination
    from commrt.collectives.broadcast import binomial as _bcast

    def run():
        vals = np.zeros(1 + len(FIELDS), np.float64)
        prior = None
        if comm.rank == 0:
            prior = _load(transport, local, hosts)
            if prior is not None and prior[2]:          # settled: no measurement
                vals[:] = (1.0, *prior[0])
        _bcast.run(call, vals, 0)
        call.wait_sends()
        source = "cached"
        if vals[0] == 0.0:
            source = "measured"
            r = comm.rank
            vals[0] = 1.0
            # Every rank arrives before anyone measures.  The broadcast above does
            # not wait for them: a rank still importing or compiling on its first
            # collective shares the cores with the pair timed below.
            _dissemination.run(call)
            quiet = _measure_pair(call, shm_pair or net_pair, vals, 1)
            if net_pair and shm_pair:
                quiet = _measure_pair(call, net_pair, vals, 7) and quiet
            elif net_pair:
                vals[7:9] = vals[1:3]
            busy, gen = _busy_step(call, local)   # every rank at once: 8-byte recursive doubling
            plan_step = _plan_step(call)
            if comm.size == 2:
                busy = vals[1]
            if r == 0:
                gamma, _ = _measure_gamma()
                gamma_mem, fastest = _measure_gamma(GAMMA_LARGE, 5)
                # memory is never this much slower than cache for a streaming
                # kernel: a busy host, not the machine
                quiet = quiet and gamma_mem < NOISY * fastest and gamma_mem < 2 * NOISY * gamma
                gamma_mem = min(gamma_mem, 2 * NOISY * gamma)
                vals[3:7] = (gamma, _measure_mu(), busy, gamma_mem)
                vals[9:11] = (gen, plan_step)
                if quiet or prior is not None:          # stored below only if quiet
                    merged, samples, settled = _merge(prior, vals[1:])
                    vals[1:] = merged
            _bcast.run(call, vals, 0)
            call.wait_sends()
            if r == 0 and quiet:
                _store(transport, local, vals[1:], hosts, samples, settled)
        v = dict(zip(FIELDS, (float(x) for x in vals[1:])))
        return Params(**v, segment=config.get("COMMRT_RING_SEGMENT_BYTES"), cores=_cores(),
                      local=local, transport=transport, source=source, hosts=hosts)

    st = state_of(comm)
    st.calibrating = True           # probes are not judged meanwhile (call.check_probes)
    try:
        p = execute(call, run, False)
    finally:
        st.calibrating = False
    st.cache["cost"] = p
    return p


def _link(mod, p):
    """The parameters a module is costed with: on several hosts a flat algorithm
    runs at the network's pace with the NIC shared by its host's ranks
    (``NET_SHARE``: how many of them send through it at once; default all),
    unless the module costs its link classes itself (``LINKS = True``)."""
    if getattr(mod, "LINKS", False):
        return p
    return p.net(getattr(mod, "NET_SHARE", p.local))


def predict(collective, comm, nbytes, p=None):
    """{algorithm: predicted seconds} of every eligible algorithm of a collective
    (collectives/registry.py), in tie-break order: its cost, plus c_gen where
    a call of that size would take the general path (no prepared plan)."""
    from commrt.collectives import plans, registry

    p = p or params(comm)
    out = {}
    for name, mod in registry.table()[collective].items():
        check = getattr(mod, "eligible", None)
        if check is None or check(comm):
            q = _link(mod, p)
            planned = plans.applies(collective, name, comm.size, nbytes)
            if planned and p.alpha_plan and p.hosts <= 1:
                # its steps are the compiled chain's, not the general path's; but in
                # a pipeline each step waits on a neighbour that is busy copying the
                # one before, for a context switch where ranks outnumber cores
                # (SEGMENT_WAITS: the ring's and the chain's), which no plan removes:
                # with one segment a step too (the ring all-reduce at N = 3, 64-256
                # KiB: 40-44 us measured against the tree's 35-38, modelled 23.5
                # against 23.6 with the chain's α; 2026-12-05)
                waits = getattr(mod, "SEGMENT_WAITS", False)
                busy = q.alpha_busy if waits else min(q.alpha_busy, p.alpha_plan)
                q = replace(q, alpha=min(q.alpha, p.alpha_plan), alpha_busy=busy)
            t = mod.cost(comm.size, nbytes, q, comm)
            if not planned:
                t += p.call
            out[name] = t
    return out


def predict_allreduce(comm, nbytes, p=None):
    return predict("all_reduce", comm, nbytes, p)


def cheapest(pred):
    """The cheapest prediction; ties (within rounding: equal formulas summed in
    different orders) go to the first in the registry's order."""
    lo = min(pred.values())
    return next(name for name, t in pred.items() if t <= lo * (1 + 1e-9))


MAX_CHOICES = 4096       # remembered choices per collective and communicator


def choose(collective, comm, nbytes, timeout=None):
    """The algorithm of `collective` for nbytes on comm: COMMRT_<COLLECTIVE>_ALGO,
    else the cheapest by the model, or from COMMRT_TUNE_MIN_BYTES up the fastest
    of its plausible candidates as measured (collectives/tuning.py) (memoised
    per size; the same on every rank).
    timeout: the user call's, which bounds a calibration run inside it."""
    from commrt.collectives import registry
    from commrt.collectives.state import state_of

    forced = config.forced_algorithm(collective)
    if forced:
        return forced
    names = registry.names(collective)
    if comm.size == 1 or len(names) == 1:   # nothing to choose: no calibration
        return names[0]
    memo = state_of(comm).cache.get(("choice", collective))
    if memo is None:
        memo = state_of(comm).cache[("choice", collective)] = {}
    algo = memo.get(nbytes)
    if algo is None:
        if len(memo) >= MAX_CHOICES:      # bounded: sizes vary without end in some jobs
            memo.clear()
        p = params(comm, timeout, serving=collective)
        pred = predict(collective, comm, nbytes, p)
        algo = cheapest(pred)
        if tuning.applies(collective, comm, nbytes):    # large: measured, once a size class
            algo = tuning.choice(collective, comm, nbytes, pred, algo, p, timeout)
        memo[nbytes] = algo
    return algo


def choices(collective, comm):
    """{reference bytes: algorithm} that choose() has picked for collective on comm
    so far (a copy of its memo)."""
    from commrt.collectives.state import state_of

    return dict(state_of(comm).cache.get(("choice", collective)) or {})


def choose_allreduce(comm, nbytes):
    return choose("all_reduce", comm, nbytes)


def describe(comm):
    return asdict(params(comm))
