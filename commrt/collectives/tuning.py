"""Measured choice for large calls: the candidates the cost model cannot tell
apart are timed, once per size class, inside the first call that needs them.

Why.  From a few MiB up the model's one β (a 1 MiB exchange) misjudges what
happens on a real host: a one-way message whose both cores copy (a split read)
runs 2-3x faster per byte than an exchange's halves, segments that stay in
cache beat halves that do not, and the host's fast and slow states move all of
these.  At N = 2 from 8 MiB the model's Rabenseifner was 1.18-1.37x the best
fixed algorithm (docs/performance-collectives.md).  Such a call takes
milliseconds, so timing the plausible candidates once costs a few calls.

How.  `choice` runs inside the user's call, on every rank at the same point
(cost.choose runs there, as its calibration does).  The candidates
(predicted within SPREAD of the model's pick) run as ordinary calls naming
their algorithm, on scratch buffers of the call's size (at most MAX_BYTES),
so each on the prepared plan a user's call of it would take: one untimed
round (a first run pays for its plan, scratch and fresh pages, up to 4x),
one timed round after which those DROP slower than its fastest stop, then
the rest of TIMED_ROUNDS, the order reversed every other round so that a
slow spell of the host hits all.  A timed run is BACK_TO_BACK calls and a
barrier: until every rank is done, one call overlapping the next as in a
job.  Rank 0's medians decide and it broadcasts the winner, which holds for
the call's size class (a power of two) on that communicator.  The model's
pick stands unless another is KEEP faster: noise must not flip a choice
the model already got right.  Afterwards the communicator is as before
(_settle).  A winner settled in the cost cache by earlier jobs is not taken
on trust: it runs CHECK_RUNS times as a trial, and where its time moved beyond RECHECK
of the recorded one (the host changed state: at N = 2, 16 MiB the ranking
flips between the fast and the slow state) every candidate is measured
again.  A call whose timeout= leaves some rank under ROOM_S is not measured
(trials take up to seconds where ranks outnumber cores): the model's pick
serves its size from then on (a plan may already hold it), and the class's
next call of another size with room measures.
"""
import logging
import time

from commrt import _lazy, config

np = _lazy.module("numpy", globals(), "np")   # loaded on first use (a barrier needs none)
log = logging.getLogger("commrt")

SPREAD = 2.5         # candidates: predicted within this factor of the model's best
KEEP = 1.05          # the model's choice stands unless another is this much faster
TIMED_ROUNDS = 5
BACK_TO_BACK = 2     # calls per timed run: as a job makes them, one overlapping the next
DROP = 1.5           # after one round, candidates this much slower than its fastest stop
MAX_BYTES = 32 << 20  # larger calls are tuned at this size (the same memory-bound regime)
BUDGET_S = 0.5       # predicted seconds of the rounds that run every candidate
SPENT_S = 1.0        # measured seconds of those rounds beyond which one timed round decides
RECHECK = 1.35       # a settled winner's timed run this far from its record: measure all again
CHECK_RUNS = 3       # timed runs of a settled winner, their median checked against its record
ROOM_S = 10.0        # a call whose timeout leaves any rank less than this is not measured


def size_class(nbytes):
    return int(nbytes).bit_length()


def applies(collective, comm, nbytes):
    """Whether a call of nbytes of collective is chosen by measurement."""
    return (collective in _TRIALS and config.get("COMMRT_TUNE")
            and nbytes >= max(1, config.get("COMMRT_TUNE_MIN_BYTES")))


def tuned(collective, comm):
    """{size class: algorithm} measured so far for collective on comm."""
    from commrt.collectives.state import state_of

    return dict(state_of(comm).cache.get(("tuned", collective)) or {})


def choice(collective, comm, nbytes, pred, model, p, timeout=None):
    """The algorithm for a call of nbytes: its size class's winner, measured now
    (or read from a settled entry of the cost cache) if this is the class's
    first call on comm.  pred: the cost model's {algorithm: seconds} at nbytes
    (every rank's the same); model: its pick; p: its parameters (cost.Params)."""
    from commrt.collectives.state import state_of

    memo = state_of(comm).cache.setdefault(("tuned", collective), {})
    cls = size_class(nbytes)
    algo = memo.get(cls)
    if algo is None or algo not in pred:
        cands = candidates(pred, model)
        algo = model if len(cands) < 2 else _settle(collective, comm, nbytes, cands, model, p,
                                                    timeout)
        if algo is None:                # no room before some rank's deadline: the
            return model                # model's, for this size only (cost.choose)
        memo[cls] = algo
    return algo


def candidates(pred, model):
    """The algorithms worth timing, in the registry's order: those predicted
    within SPREAD of the model's pick (always one of them), the slowest dropped
    while the two rounds that run them all (warm-up, first) would take more
    than BUDGET_S by the model."""
    best = pred[model]
    cands = [a for a, t in pred.items() if t <= SPREAD * best]
    while len(cands) > 2 and (1 + BACK_TO_BACK) * sum(pred[a] for a in cands) > BUDGET_S:
        cands.remove(max((a for a in cands if a != model), key=pred.get))
    return cands


def _settle(collective, comm, nbytes, cands, model, p, timeout):
    """Rank 0's winner for cands on every rank: a settled entry of the cost
    cache, else measured now (and recorded); None on every rank where some
    rank's timeout leaves it under ROOM_S.  The calls this makes are
    ordinary calls, so each trial runs on the prepared plan a user's call of
    it would (a plan's copies are not the general path's: the double tree at
    N = 2, 4 MiB took 240-280 us on its plan and 440-580 through the general
    path).  Afterwards the communicator is as before: its sequence numbers and
    history given back (the user's call keeps its number), the trials' plans
    dropped.  While they run no rank probes its peers (a probe that arrived
    late would name a number the user's calls take again); a rank that is not
    tuning meanwhile still sends messages with its own fingerprint, which the
    trials' receives refuse as a mismatch."""
    from commrt.collectives.state import state_of

    st = state_of(comm)
    seq, had, probe_s = st.seq, set(st.small), st.probe_s
    key = (_entry_key(p, comm.size), f"{collective}:{size_class(nbytes)}")
    try:
        with st.numbers_given_back():
            st.probe_s = float("inf")
            st.tuning = f"{collective} #{seq}"          # what a mismatch report names
            # [settled winner's index, its s/B recorded, -(this rank's time left)],
            # the max over ranks: rank 0's entry and the least time left
            pick = np.array([-1.0, -1.0, -np.inf if timeout is None else -timeout])
            if comm.rank == 0:
                cached = _cached(*key)
                if cached and cached[0] in cands:
                    pick[:2] = cands.index(cached[0]), cached[1]
            _coll().all_reduce(comm, pick, op="max", timeout=timeout)    # every rank alike
            if -pick[2] < ROOM_S:
                return None
            trial = min(nbytes, MAX_BYTES)
            run = _TRIALS[collective](comm, trial)      # scratch buffers, only now
            if pick[0] >= 0 and _confirmed(comm, run, cands[int(pick[0])], pick[1] * trial,
                                           timeout):
                return cands[int(pick[0])]
            winner, took = _measure(collective, comm, run, nbytes, cands, model, timeout)
            if comm.rank == 0:          # per byte: a size class spans sizes up to 2x apart
                _record(*key, winner, took / trial)
            return winner
    except Exception as exc:                    # a trial's own number means nothing to a user
        exc.add_note(f"commrt: raised while timing the algorithms of {collective} #{seq} "
                     f"(COMMRT_TUNE), by a call of its own")
        raise
    finally:
        st.probe_s, st.tuning = probe_s, None
        added = [k for k in st.small if k not in had]
        for k in added:
            del st.small[k]
        if added:
            st.forget_memos()       # no memo of the compiled entry may keep one


def _timed_run(comm, run, algo, reps=BACK_TO_BACK):
    """Seconds per call of reps calls of algo and the barrier after them: until
    every rank is done (a root may finish long before its last receiver)."""
    t0 = time.perf_counter()
    for _ in range(reps):
        run(comm, algo)
    _coll().barrier(comm)
    return (time.perf_counter() - t0) / reps


def _confirmed(comm, run, algo, recorded, timeout):
    """Whether a settled winner still runs at its recorded speed (the median of
    rank 0's CHECK_RUNS timed runs, after an untimed one, within RECHECK of it
    either way), on every rank."""
    _coll().barrier(comm)
    _timed_run(comm, run, algo, 1)              # its plan, scratch and pages
    took = sorted(_timed_run(comm, run, algo) for _ in range(CHECK_RUNS))[CHECK_RUNS // 2]
    ok = np.zeros(1)
    if comm.rank == 0:
        ok[0] = recorded / RECHECK <= took <= recorded * RECHECK
        log.debug("tune: settled %s took %.0f us against %.0f recorded: %s", algo,
                  took * 1e6, recorded * 1e6, "kept" if ok[0] else "measuring again")
    _coll().broadcast(comm, ok, 0, timeout=timeout)
    return bool(ok[0])


def _measure(collective, comm, run, nbytes, cands, model, timeout):
    """Time cands on scratch buffers (see the module's docstring): (rank 0's
    winner on every rank, its median seconds per call on rank 0)."""
    times = {a: [] for a in cands}
    alive = list(cands)
    start = time.perf_counter()
    for rnd in range(-1, TIMED_ROUNDS):     # round -1 warms up (and prepares the plans)
        if rnd == 1:
            alive, enough = _survivors(comm, times, model, time.perf_counter() - start)
            if enough:
                break
        reps = 1 if rnd < 0 else BACK_TO_BACK
        _coll().barrier(comm)
        for a in (alive if rnd % 2 == 0 else alive[::-1]):
            took = _timed_run(comm, run, a, reps)
            if rnd >= 0:
                times[a].append(took)
    pick = np.zeros(1, np.float64)
    took = {a: sorted(times[a])[len(times[a]) // 2] for a in alive}
    if comm.rank == 0:
        pick[0] = cands.index(decide(took, model))
        log.debug("tune %s %d B on %d ranks: %s -> %s", collective, nbytes, comm.size,
                  {a: [round(x * 1e6) for x in t] for a, t in times.items()},
                  cands[int(pick[0])])
    _coll().broadcast(comm, pick, 0, timeout=timeout)
    winner = cands[int(pick[0])]
    return winner, took[winner]


# -- the cost cache's record of winners ---------------------------------------------
# Beside each calibration entry of COMMRT_COST_CACHE (cost._cache_key: transport,
# host, link, cores, ranks per host, hosts) and the communicator's size, the
# winners measured so far per "collective:size class".  One measurement may catch
# the host in a passing state, so a winner settles, and later jobs stop measuring,
# once the last two measurements agree, or one won twice among the last
# SETTLE_AFTER (the calibration's; settles).  Each measurement keeps the winner's seconds per call
# and byte ("took"), which a later job's run of a settled winner is checked
# against.
TUNE_VERSION = 2


def _entry_key(p, size):
    from commrt.collectives import cost

    return f"tuned:{cost._cache_key(p.transport, p.local, p.hosts)}:{size}"


def _cached(entry, slot):
    """(the settled winner recorded for slot, its latest seconds per call and
    byte), or None."""
    from commrt.collectives import cost

    _, data = cost.read_cache()
    rec = data.get(entry)
    if not isinstance(rec, dict) or rec.get("version") != TUNE_VERSION:
        return None
    pairs = _measurements(rec.get(slot))
    winner, settled = settles([a for a, _ in pairs]) if pairs else (None, False)
    took = [s for a, s in pairs if a == winner]
    return (winner, took[-1]) if settled else None      # (settled by today's rule)


def _measurements(slot):
    """[(winner, its seconds per call and byte), ...] that a cache slot records,
    oldest first (malformed entries skipped)."""
    if not isinstance(slot, dict):
        return []
    return [(a, float(s)) for a, s in zip(slot.get("seen", []), slot.get("took", []))
            if isinstance(a, str) and isinstance(s, (int, float)) and s > 0]


def settles(seen):
    """(winner, settled) after the winners seen so far, oldest first (the last
    SETTLE_AFTER at most): settled where the last two agree, or where one won
    twice among them (ties: the latest).  Winners that all differ stay
    unsettled, so each job measures: candidates that near-tie, or a ranking
    that the host's state flips (N = 2, 16 MiB: the parameter server, the
    reduce+broadcast, the double tree and Rabenseifner in four jobs)."""
    from commrt.collectives.cost import SETTLE_AFTER

    if len(seen) >= 2 and seen[-1] == seen[-2]:
        return seen[-1], True
    if len(seen) >= SETTLE_AFTER:
        best = max(reversed(seen), key=seen.count)
        return best, seen.count(best) >= 2
    return seen[-1], False


def _record(entry, slot, algo, took):
    """Add a measured winner and its seconds per call and byte to the cost cache
    (rank 0)."""
    from commrt.collectives import cost

    path, data = cost.read_cache()
    if not path:
        return
    rec = data.get(entry)
    if not isinstance(rec, dict) or rec.get("version") != TUNE_VERSION:
        rec = data[entry] = {"version": TUNE_VERSION}
    pairs = _measurements(rec.get(slot))[-cost.SETTLE_AFTER + 1:] + [(algo, float(took))]
    winner, settled = settles([a for a, _ in pairs])
    rec[slot] = {"algo": winner, "settled": settled, "seen": [a for a, _ in pairs],
                 "took": [s for _, s in pairs], "when": time.time()}
    cost.write_cache(path, data)


def _coll():
    import commrt.collectives as coll

    return coll


def decide(took, model):
    """The winner given {candidate: seconds} (the model's pick among them): the
    fastest, unless the model's pick is within KEEP of it."""
    fastest = min(took, key=took.get)
    return model if took[model] <= KEEP * took[fastest] else fastest


def _survivors(comm, times, model, spent):
    """(the candidates worth more rounds after the first, whether to stop now):
    those within DROP of the first round's fastest on rank 0, and the model's;
    stop where the two rounds so far took rank 0 over SPENT_S (the first runs
    of large calls where ranks outnumber cores: a single timed round then
    decides, and the cache's settling rule catches a noisy pick).  Broadcast,
    so that every rank runs the same."""
    keep = np.zeros(len(times) + 1, np.float64)
    if comm.rank == 0:
        best = min(t[0] for t in times.values())
        keep[:-1] = [a == model or t[0] <= DROP * best for a, t in times.items()]
        keep[-1] = spent > SPENT_S
    _coll().broadcast(comm, keep, 0)
    return [a for a, k in zip(times, keep) if k], bool(keep[-1])


def _floats(count):
    out = np.zeros(max(1, count), np.float32)
    out.fill(0)                                     # touched: no page faults timed
    return out


# A trial: run(comm, algorithm) calls the collective on scratch buffers made once.
def _all_reduce(comm, nbytes):
    buf = _floats(nbytes // 4)
    return lambda comm, a: _coll().all_reduce(comm, buf, algorithm=a)


def _broadcast(comm, nbytes):
    buf = _floats(nbytes // 4)
    return lambda comm, a: _coll().broadcast(comm, buf, 0, algorithm=a)


def _reduce(comm, nbytes):
    buf = _floats(nbytes // 4)
    return lambda comm, a: _coll().reduce(comm, buf, 0, algorithm=a)


def _all_gather(comm, nbytes):
    """nbytes: the output's (cost.choose's reference size)."""
    block = max(1, nbytes // 4 // comm.size)
    out, buf = _floats(block * comm.size), _floats(block)
    return lambda comm, a: _coll().all_gather(comm, out, buf, algorithm=a)


def _reduce_scatter(comm, nbytes):
    """nbytes: the input's (cost.choose's reference size)."""
    block = max(1, nbytes // 4 // comm.size)
    out, buf = _floats(block), _floats(block * comm.size)
    return lambda comm, a: _coll().reduce_scatter(comm, out, buf, algorithm=a)


# the collectives with a choice to make whose calls take one size (the variable-
# size ones take per-rank counts the size alone does not give)
_TRIALS = {"all_reduce": _all_reduce, "broadcast": _broadcast, "reduce": _reduce,
           "all_gather": _all_gather, "reduce_scatter": _reduce_scatter}
