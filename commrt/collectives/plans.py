"""Prepared plans for broadcast, reduce, gather, scatter, all-gather,
reduce-scatter, all-to-all, their variable-size forms (all_gatherv,
gatherv, scatterv, all_to_allv), the ring reduce-scatter and the ring's,
reduce_bcast's, ps's, dbtree's and hierarchical's all-reduce,
built from the chosen algorithm's own ``schedule`` (recursive doubling's and
Rabenseifner's on power-of-two worlds, and the barrier's, are in _small.py).

The general path spends microseconds in Python before its first message
(argument checks, the cost model, a Call object): several times the
transport's own latency at small sizes.  So the first call of a given
(collective, shapes, dtype, root, op) whose algorithm the cost model chose,
and that has a schedule and a layout here, leaves a plan behind: the
fingerprint without its sequence number and a persistent chain
(``Channel.exchange_chain``, transport/chain.pxi) whose steps are the
schedule's steps, each message a byte range of the output (the chain's
in/out buffer), of the input (sent from only) or of the plan's scratch, a
"combine" message a reduce-receive with the reduction's C loop, plus the
local copies the algorithm makes (an all-gather's own block, Bruck's
rotation).  A later blocking call with the same arguments, no ``timeout=``
and no ``async_op=``, stamps the sequence number and runs the chain: one C
call.  A call that names its algorithm (``algorithm=``) gets a plan of its
own, keyed with the name last, which the compiled entry runs as it runs the
cost model's choice (the variable-size collectives': the general path's
first lines, collectives._keyed_plan).

The messages, fingerprints and operand order are the general path's (the
same schedule, the same reduce-receives), so ranks on either path
interoperate and results are bitwise equal.  Anything unusual (no answer
within the probe interval, an error, another fingerprint or size) stops the
chain at that step and hands the step's requests and the rest of the
schedule to a Call with the same sequence number, which waits, probes and
reports exactly as the general path does.

The chain waits for a step's sends before its next step, where the general
path waits at the end of the call: the same messages, but a send that had
to wait for its receiver's later step could deadlock.  Steps of these
schedules are matched step for step or down a tree (the ring all-reduce's
and reduce-scatter's once regrouped: _all_reduce_ring; dbtree's in rounds,
each message posted by both its ranks in the same round), except the direct
reduce-scatter's (its sends go out in step 0, its receives are taken one
peer after another), whose plan is therefore only made, beyond N = 2 (one
peer: matched in step 0), for blocks small enough to be sent eagerly
(COMMRT_EAGER_LIMIT), which complete as posted.
"""
import warnings

from commrt import _lazy

from commrt import config
from commrt.collectives import _small
from commrt.collectives._entry import SCHED, PlanCore
from commrt.collectives.chunking import offsets
from commrt.collectives.call import Call, Recv
from commrt.collectives.fingerprint import DTYPE_CODE, SEQ_MASK, TAG, algo_code, kind_code, pack
from commrt.comm import Channel
from commrt.transport.buffers import aligned_empty
np = _lazy.module("numpy", globals(), "np")   # loaded on first use (a barrier needs none)

RECV, SEND, COPY = 0, 1, 2          # chain message kinds (transport/chain.pxi)
BUF, IN, TMP = 0, 1, 2              # the output, the input, the plan's scratch
MAX_BYTES = 16 << 20                # beyond, a plan saves under 0.1% of a call
MAX_TMP_BYTES = 1 << 20             # a plan holding scratch keeps it: bounded
PIPELINE_MAX_BYTES = 4 << 20        # the pipelined broadcast's plans (_pipeline_fits)
RING_READ_BYTES = 4 << 20           # the ring all-reduce's receives read (_all_reduce_ring)


class SchedPlan(PlanCore):
    """One prepared collective: its fingerprint, its chain, the chain's steps
    (message tuples, for the hand-over), and what follows a clean run.  (The
    fields the compiled entry reads are PlanCore's, _entry.pyx.)"""
    __slots__ = ("kind", "algo", "count", "op", "root", "steps", "wait", "isz", "avg", "large",
                 "after")
    sched = True            # (the all-reduce's entry tells these from _small's plans: mode)

    def __init__(self, comm, st, kind, algo, count, dtype, op, root, steps, tmp, nbytes,
                 in_nbytes, avg, hooks=None, kernel=None):
        """hooks: per step, 0 or (C address, our operand first) of a combine of tmp
        into the output after the step (recursive doubling's ordered combine)."""
        self.mode = SCHED
        self.kind, self.algo, self.count, self.dtype, self.op, self.root = (
            kind, algo, count, np.dtype(dtype), op, root)
        self.base, self.meta2 = pack(0, kind_code(kind), algo_code(kind, algo), count,
                                     DTYPE_CODE.get(self.dtype, 63),
                                     op.value if op is not None else 0, root)
        self.steps, self.nsteps, self.tmp = steps, len(steps), tmp
        self.isz = self.dtype.itemsize
        hooks = hooks or [0] * len(steps)
        self.after = [None if not h else (kernel, not h[1]) for h in hooks]
        self.chain = comm.channel.exchange_chain(
            [(msgs, h[0] if h else 0) for msgs, h in zip(steps, hooks)], tmp,
            count if any(hooks) else 0, TAG, nbytes, self.isz, in_nbytes)
        self.wait = min(st.probe_s, st.timeout)
        self.chain.stamp(self.base, self.meta2, self.wait, SEQ_MASK)
        self.avg = avg
        self.large = max(nbytes, in_nbytes) > _small.RANGED_MAX_BYTES // 16
        self.plain = not (self.avg or self.large)      # nothing to do after a clean run


# -- layouts: an algorithm's schedule as chain messages ----------------------------------
def _msgs(step, isz, where_recv, where_send, hook=0):
    """A schedule's step as chain messages; a message on a lane of the call (its
    ctx a tag: dbtree's trees, fingerprint.LANE_TAGS) names its tag."""
    out = []
    for m in step:
        if m.op == "send":
            msg = (SEND, m.peer, where_send, m.lo * isz, (m.hi - m.lo) * isz, 0)
        else:
            msg = (RECV, m.peer, where_recv, m.lo * isz, (m.hi - m.lo) * isz,
                   hook if m.op == "combine" else 0)
        if type(m.ctx) is int:
            msg += (0, 0, 0, m.ctx)
        elif m.ctx is not None:
            raise ValueError(f"a plan's messages travel on the call's context, not {m.ctx!r}")
        out.append(msg)
    return out


def _with_copier(msg, copier):
    """A receive with this copier (Channel.irecv's), its tag kept."""
    return msg[:6] + (0, 0, copier) + msg[9:]


def _copy(rank, where, off, src_where, src_off, nbytes):
    return (COPY, rank, where, off, nbytes, 0, src_where, src_off)


def _broadcast(n, r, sched, m, isz, root, hook):
    return [_msgs(s, isz, BUF, BUF) for s in sched], None


def _broadcast_pipeline(n, r, sched, m, isz, root, hook):
    """The chain root -> root+1 -> ...: each step forwards the segment received
    in the step before (matched down the chain: no rank waits on a later step
    of one before it)."""
    if not _pipeline_fits(n, m * isz):
        return None, None
    return _copied_by(Channel.RECEIVER, _broadcast(n, r, sched, m, isz, root, hook)[0]), None


def _gather(n, r, sched, m, isz, root, hook):
    if r != root:
        return [_msgs(s, isz, BUF, IN) for s in sched], None
    # the senders write their blocks (gather/linear.py)
    steps = _copied_by(Channel.SENDER, [_msgs(s, isz, BUF, IN) for s in sched])
    steps[0].insert(0, _copy(r, BUF, root * m * isz, IN, 0, m * isz))
    return steps, None


def _scatter(n, r, sched, m, isz, root, hook):
    """(a receiver's copier: scatter/linear.copier, applied by prepare)"""
    steps = [_msgs(s, isz, BUF, IN) for s in sched]
    if r == root:
        steps[0].insert(0, _copy(r, BUF, 0, IN, root * m * isz, m * isz))
    return steps, None


def _all_gather_bruck(n, r, sched, m, isz, root, hook):
    b = m * isz
    steps = [_msgs(s, isz, TMP, TMP) for s in sched]
    steps[0].insert(0, _copy(r, TMP, 0, IN, 0, b))
    # work block i is rank r+i's: rotate into place
    steps.append([_copy(r, BUF, r * b, TMP, 0, (n - r) * b),
                  _copy(r, BUF, 0, TMP, (n - r) * b, r * b)])
    return steps, n * b


def _all_gather_out(n, r, sched, m, isz, root, hook):
    """direct and ring: positions in out; each receive half of an exchange
    (all_gather/ring.py; direct's then take its module's copier,
    all_gather/direct.py, applied by prepare); one's own block sent from the
    input and copied into out while it goes (_own_block_from_input)."""
    steps = _copied_by(Channel.EXCHANGE, [_msgs(s, isz, BUF, BUF) for s in sched])
    return _own_block_from_input(steps, r, r * m * isz, m * isz), None


def _own_block_from_input(steps, r, off, nbytes):
    """An all-gather's sends of one's own block (at off in out) read the input, and
    the copy of it into out follows the first step's messages, as the general
    paths do: the copy then overlaps the peers' reads of the input, where a
    send from out would wait for it and have the peer read lines this core has
    just written (N = 2, 1 MiB, freshly written: 67-69 -> 56-58 us; on the
    host's slow state 293 -> 56-112)."""
    steps = [[msg[:2] + (IN, 0) + msg[4:] if msg[0] == SEND and msg[3:5] == (off, nbytes) else msg
              for msg in step] for step in steps]
    steps[0].append(_copy(r, BUF, off, IN, 0, nbytes))
    return steps


# the variable-size collectives: sched_count is their counts (a list, or
# all_to_allv's matrix), positions in out as their schedules give them
def _all_gatherv(n, r, sched, counts, isz, root, hook):
    """direct and ring: as all_gather's (_all_gather_out), one's own block sent from
    the input; each receive's copier is its module's copier_from (by its peer,
    as half of an exchange), applied by prepare as run applies it."""
    offs = offsets(counts)
    steps = [_msgs(s, isz, BUF, BUF) for s in sched]
    return _own_block_from_input(steps, r, offs[r] * isz, counts[r] * isz), None


def _gatherv(n, r, sched, counts, isz, root, hook):
    steps = [_msgs(s, isz, BUF, IN) for s in sched]
    if r == root:
        steps = _copied_by(Channel.SENDER, steps)     # the senders write (as _gather)
        offs = offsets(counts)
        steps[0].append(_copy(r, BUF, offs[r] * isz, IN, 0, counts[r] * isz))
    return steps, None


def _scatterv(n, r, sched, counts, isz, root, hook):
    """(a receiver's copier: scatter/linear.copier, applied by prepare)"""
    steps = [_msgs(s, isz, BUF, IN) for s in sched]
    if r == root:
        offs = offsets(counts)
        steps[0].append(_copy(r, BUF, 0, IN, offs[r] * isz, counts[r] * isz))
    return steps, None


def _all_to_allv(n, r, sched, counts, isz, root, hook):
    """(each receive's copier: all_to_all/pairwise.copier by its block's size,
    applied by prepare)"""
    so = offsets(counts[r])
    ro = offsets([counts[q][r] for q in range(n)])
    steps = [_msgs(s, isz, BUF, IN) for s in sched]
    steps[0].append(_copy(r, BUF, ro[r] * isz, IN, so[r] * isz, counts[r][r] * isz))
    return steps, None


def _eager_blocks(n, nbytes):
    """The direct reduce-scatter's plan (nbytes: its input): beyond two ranks only
    for blocks sent eagerly (see the module's text)."""
    return n == 2 or nbytes // n <= config.get("COMMRT_EAGER_LIMIT")


def _pipeline_fits(n, nbytes):
    """The pipelined broadcast's plan, up to 4 MiB: a chain waits for a step's
    send before its next step, so beyond, where the general path keeps several
    segments in flight down the chain, the plan lost (N = 4, 16 MiB: 7.7 ms on
    the general path, 9.2-9.9 planned; 4 MiB 1.92 -> 1.46-1.53 planned)."""
    return nbytes <= PIPELINE_MAX_BYTES


def _scratch_fits(n, nbytes):
    """Bruck's plan (nbytes: the output, the size of its scratch)."""
    return nbytes <= MAX_TMP_BYTES


def _reduce_scatter(n, r, sched, m, isz, root, hook):
    """Our own block copied into the output, then the schedule's combines into it
    (with the reduction's C loop only: no scratch to combine from)."""
    if not hook:
        return None, None
    steps = [_msgs(s, isz, BUF, IN, hook) for s in sched]
    steps[0].insert(0, _copy(r, BUF, 0, IN, r * m * isz, m * isz))
    return steps, None


def _reduce_scatter_ring(n, r, sched, m, isz, root, hook):
    """The ring's partial blocks combined in scratch that starts as a copy of the
    input (which stays unchanged), the last step's into the output, which
    starts as our own block (the general path's "incoming partial first" is
    the same sum: two operands, each combine a reduce-receive); the first
    step's sends from the input; regrouped as the ring all-reduce's (step t:
    the t-th send and the t-th receive, _paired).  A send after the first
    step's forwards a segment combined at least a block's segments earlier,
    so it is final when its step posts.  Scratch: the input's size."""
    if not hook:
        return None, None
    first = sum(1 for msg in sched[0] if msg.op == "send")     # the first block's segments
    msgs = [msg for s in sched for msg in s]
    sends = [msg for msg in msgs if msg.op == "send"]
    combines = [msg for msg in msgs if msg.op == "combine"]
    last = len(combines) - first                               # from here: into the output
    out = [*_msgs(sends[:first], isz, TMP, IN), *_msgs(sends[first:], isz, TMP, TMP),
           *_msgs(combines[:last], isz, TMP, TMP, hook),
           *_msgs(combines[last:], isz, BUF, TMP, hook)]
    steps = _paired(out) or [[]]            # (empty blocks: the copies alone)
    steps[0][:0] = [_copy(r, TMP, 0, IN, 0, n * m * isz),
                    _copy(r, BUF, 0, IN, r * m * isz, m * isz)]
    return steps, n * m * isz


def _reduce_scatter_direct(n, r, sched, m, isz, root, hook):
    if not _eager_blocks(n, n * m * isz):
        return None, None
    return _reduce_scatter(n, r, sched, m, isz, root, hook)


def _all_to_all(n, r, sched, m, isz, root, hook):
    # (each receive's copier: all_to_all/pairwise.copier, applied by prepare)
    steps = [_msgs(s, isz, BUF, IN) for s in sched]
    steps[0].insert(0, _copy(r, BUF, r * m * isz, IN, r * m * isz, m * isz))
    return steps, None


def _reduce_binomial(n, r, sched, m, isz, root, hook):
    """The root combines into its buf; an inner node into scratch (its buf stays
    unchanged) from a copy of its buf, then sends that; a leaf sends its buf."""
    if not hook:
        return None, None
    if r == root:
        return _copied_by(Channel.SENDER, [_msgs(s, isz, BUF, BUF, hook) for s in sched]), None
    if not any(msg.op == "combine" for s in sched for msg in s):
        return [_msgs(s, isz, BUF, IN) for s in sched], None
    steps = _copied_by(Channel.SENDER, [_msgs(s, isz, TMP, TMP, hook) for s in sched])
    steps[0].insert(0, _copy(r, TMP, 0, IN, 0, m * isz))
    return steps, m * isz


def _all_reduce_ring(n, r, sched, m, isz, root, hook):
    """Every message a range of the buffer, each combine a reduce-receive into it
    as it lands (the in-place ring reduce-scatter's irecv_combine with a C
    loop), then the all-gather's receives into it; regrouped so that step t
    holds the rank's t-th send and its t-th receive.  The schedule sends all
    of chunk r's segments in its first step and receives them over several,
    which a chain (it waits for a step's sends before the next) could deadlock
    on; regrouped, step t of every rank sends to the right what the right's
    step t receives.  The messages and their order on each pair are the
    schedule's: the t-th send forwards a segment received at least a chunk
    earlier (each send but chunk r's forwards what came from the left, in
    order), so it is final when its step posts, and the two messages of a
    step touch different segments.  (Chunks of different segment counts
    make the two lists differ in length: the longer one's tail goes alone.)"""
    if not hook:
        return None, None
    steps = _paired([msg for s in sched for msg in _msgs(s, isz, BUF, BUF, hook)])
    if m * isz >= RING_READ_BYTES:
        # each receive is half of an exchange: where ranks share cores it is read
        # with process_vm_readv (a reduce-receive through its bounce buffer)
        # rather than streamed, which needs its sender on a core at the same
        # time; with a core each the segments stay below the read threshold
        # (transport/shm.pxi read_early), so nothing changes there
        steps = _copied_by(Channel.EXCHANGE, steps)
    return steps, None


def _all_reduce_hierarchical(n, r, sched, m, isz, root, hook):
    """Hierarchical's three steps (sched: all_reduce/hierarchical.planned_phases),
    each laid out as its own algorithm's plan lays out the same messages: the
    host reduce in place as reduce_bcast's (combines streamed by their
    senders' cores), the leaders' ring as the ring all-reduce's, the host
    broadcast as the binomial's (with its copier) or the pipeline's.  The
    chain runs them one after another, as run does: between two ranks no two
    steps send the same way, and each step is matched as its own plan is."""
    (host_reduce, leaders_ring, host_bcast), who = sched
    if not hook or not _pipeline_fits(n, m * isz):
        return None, None
    steps = _all_reduce_reduce_bcast(n, r, host_reduce, m, isz, root, hook)[0]
    if leaders_ring:
        steps += _all_reduce_ring(n, r, leaders_ring, m, isz, root, hook)[0]
    steps += _copied_by(who, _broadcast(n, r, host_bcast, m, isz, root, 0)[0])
    return steps, None


def _paired(msgs):
    """The ring's messages regrouped so that step t holds the t-th send and the
    t-th receive (see _all_reduce_ring)."""
    sends = [msg for msg in msgs if msg[0] == SEND]
    recvs = [msg for msg in msgs if msg[0] == RECV]
    return [[*sends[t:t + 1], *recvs[t:t + 1]] for t in range(max(len(sends), len(recvs)))]


def _reduce_ring(n, r, sched, m, isz, root, hook):
    """The in-place ring reduce-scatter, regrouped as the ring all-reduce's (step t:
    the t-th send and the t-th receive), in the buffer at the root and in
    scratch holding a copy of the input elsewhere (the input stays unchanged),
    then the last step: each rank's reduced chunk to the root, which receives
    them straight into its buffer."""
    if not hook:
        return None, None
    where = BUF if r == root else TMP
    steps = _paired([msg for s in sched[:-1] for msg in _msgs(s, isz, where, where, hook)])
    steps.append(_msgs(sched[-1], isz, BUF, where))
    if r == root:
        return steps, None
    steps[0].insert(0, _copy(r, TMP, 0, IN, 0, m * isz))
    return steps, m * isz


def _all_reduce_reduce_bcast(n, r, sched, m, isz, root, hook):
    """The binomial reduce in place into the buffer (reduce_to with acc=buf: its
    combines stream, the senders' cores copying), then the binomial broadcast
    from rank 0 into it."""
    if not hook:
        return None, None
    return [[_with_copier(msg, Channel.SENDER) if msg[0] == RECV and msg[5] else msg
             for msg in _msgs(s, isz, BUF, BUF, hook)] for s in sched], None


def _all_reduce_ps(n, r, sched, m, isz, root, hook):
    """The parameter server's all-reduce, every combine a reduce-receive into the
    buffer.  Rank 0 takes a segment's copies one peer at a time, in rank
    order, each in a step of its own (the first with the sends of the
    segment before): the general path's order, rank 1's copy combined as it
    lands and the others in one pass after it, dst OP x2 OP x3 ..., which
    is the same bits where there is a C loop (no float16 accumulator); in
    one step they would combine in the order they land.  The other ranks'
    single step (send every segment, receive the results) is the schedule's."""
    if not hook:
        return None, None
    steps = []
    for s in sched:
        msgs = _msgs(s, isz, BUF, BUF, hook)
        combines = [x for x in msgs if x[0] == RECV and x[5]]
        if len(combines) < 2:
            steps.append(msgs)
            continue
        steps.append([x for x in msgs if x not in combines[1:]])
        steps.extend([x] for x in combines[1:])
    return steps, None


def _all_reduce_dbtree(n, r, sched, m, isz, root, hook):
    """The double binary tree's rounds as they are, each tree's messages on its
    lane (their tags), every combine a reduce-receive into the buffer.  A
    node's two children's copies of a segment come in different rounds, the
    first child's first: the general path's operand order (all_reduce/dbtree.py)."""
    if not hook:
        return None, None
    return [_msgs(s, isz, BUF, BUF, hook) for s in sched], None


def _copied_by(copier, steps):
    """Every receive of steps with this copier (Channel.irecv's): SENDER for a
    tree's combines (reduce/binomial.py: they stream, the senders' cores
    copying), RECEIVER or EXCHANGE where every rank reads its own blocks."""
    return _copied_each(lambda nbytes: copier, steps)


def _copied_from(who, steps):
    """Each receive of steps with the copier who(its peer) names, 0 included (the
    transport's choice)."""
    return [[_with_copier(msg, who(msg[1])) if msg[0] == RECV else msg for msg in s]
            for s in steps]


def _copied_each(who, steps):
    """Each receive of steps with the copier who(its bytes) names; 0 leaves the
    receive as the layout made it (the transport's choice, or the layout's)."""
    out = []
    for s in steps:
        step = []
        for msg in s:
            copier = who(msg[4]) if msg[0] == RECV else 0
            step.append(_with_copier(msg, copier) if copier else msg)
        out.append(step)
    return out


def _whole_buffer_fits(buf, red):
    """Whether a whole-buffer all-reduce plan (recursive doubling's beyond powers of
    two, the tree's) can run on buf: a C combine loop, a dtype on the wire, a
    contiguous writable buffer."""
    return bool(red.hook) and buf.dtype in DTYPE_CODE and buf.flags.c_contiguous \
        and buf.flags.writeable


def _keep_whole(comm, st, key, algo, buf, op, red, steps, hooks):
    """Keep a whole-buffer all-reduce plan: its steps, the steps' hooks (0 or
    (C address, our operand first)), a scratch buffer of the buffer's size."""
    nb = buf.nbytes
    _small._keep(st, key, SchedPlan(comm, st, "all_reduce", algo, buf.size, buf.dtype, op, 0,
                                    steps, aligned_empty(nb, np.uint8), nb, 0, op.name == "AVG",
                                    hooks, red.kernel))


def prepare_all_reduce(comm, st, key, buf, op, red):
    """A plan for recursive doubling on a world that is not a power of two (the
    power-of-two ones are _small.py's): the fold's send-only and receive-only
    steps around the exchanges, which combine after the step with the lower
    rank's operand first, as the general path does."""
    from commrt.collectives.all_reduce import recursive_doubling
    from commrt.kernels import combine_address

    n, r = comm.size, comm.rank
    if n < 3 or not n & (n - 1) or not _whole_buffer_fits(buf, red) or buf.nbytes > MAX_TMP_BYTES:
        return
    nb = buf.nbytes
    steps, hooks = [], []
    for step in recursive_doubling.schedule(n, r, buf.size):
        exchange = len(step) == 2
        msgs = []
        for m in step:
            if m.op == "send":
                msgs.append((SEND, m.peer, BUF, 0, nb, 0))
            elif exchange:                  # received whole, combined after the step
                msgs.insert(0, (RECV, m.peer, TMP, 0, nb, 0))
            else:                           # the fold: combined as it lands, or the result
                msgs.append((RECV, m.peer, BUF, 0, nb, red.hook if m.op == "combine" else 0))
        first = exchange and r < step[0].peer
        steps.append(msgs)
        hooks.append((combine_address(red.kernel, buf.dtype, not first), first) if exchange
                     else 0)
    if not all(h == 0 or h[0] for h in hooks):
        return
    _keep_whole(comm, st, key, "recursive_doubling", buf, op, red, steps, hooks)


def prepare_tree(comm, st, key, buf, op, red):
    """A plan for the binary-tree all-reduce of one segment (the buffer within
    COMMRT_RING_SEGMENT_BYTES): its schedule's steps over the whole buffer.  A
    step that combines both children's copies takes the first child's as a
    reduce-receive into the buffer and the second's into scratch, which the
    step's hook then combines in: (own OP first) OP second, the general path's
    order (it posts the second child's reduce-receive once the first's is
    done).  Segmented trees keep to the general path: the hook combines the
    whole buffer, not a segment."""
    from commrt.collectives.all_reduce import tree
    from commrt.collectives.chunking import seg_elems
    from commrt.kernels import combine_address

    n, r = comm.size, comm.rank
    if n < 2 or not buf.size or buf.size > seg_elems(buf.itemsize) \
            or not _whole_buffer_fits(buf, red):
        return
    nb = buf.nbytes
    after = combine_address(red.kernel, buf.dtype, False)      # buf = buf OP tmp
    if not after:
        return
    steps, hooks = [], []
    for step in tree.schedule(n, r, buf.size, 0, itemsize=buf.itemsize):
        combines = [m for m in step if m.op == "combine"]
        msgs = []
        for m in step:
            if m.op == "send":
                msgs.append((SEND, m.peer, BUF, 0, nb, 0))
            elif m.op == "recv":
                msgs.append((RECV, m.peer, BUF, 0, nb, 0))
            elif m is combines[0]:
                msgs.append((RECV, m.peer, BUF, 0, nb, red.hook))
            else:
                msgs.append((RECV, m.peer, TMP, 0, nb, 0))
        steps.append(msgs)
        hooks.append((after, True) if len(combines) > 1 else 0)
    _keep_whole(comm, st, key, "tree", buf, op, red, steps, hooks)


def _one_segment(n, nbytes):
    """The tree all-reduce's plan (nbytes: the buffer): one segment."""
    return nbytes <= config.get("COMMRT_RING_SEGMENT_BYTES")


LAYOUTS = {("broadcast", "binomial"): _broadcast, ("broadcast", "pipeline"): _broadcast_pipeline,
           ("gather", "linear"): _gather,
           ("scatter", "linear"): _scatter, ("all_gather", "bruck"): _all_gather_bruck,
           ("all_gather", "direct"): _all_gather_out, ("all_gather", "ring"): _all_gather_out,
           ("reduce_scatter", "direct"): _reduce_scatter_direct,
           ("reduce_scatter", "pairwise"): _reduce_scatter,
           ("reduce_scatter", "ring"): _reduce_scatter_ring,
           ("all_to_all", "pairwise"): _all_to_all, ("reduce", "binomial"): _reduce_binomial,
           ("all_gatherv", "direct"): _all_gatherv, ("all_gatherv", "ring"): _all_gatherv,
           ("gatherv", "linear"): _gatherv, ("scatterv", "linear"): _scatterv,
           ("all_to_allv", "pairwise"): _all_to_allv,
           ("all_reduce", "ring"): _all_reduce_ring,
           ("all_reduce", "reduce_bcast"): _all_reduce_reduce_bcast,
           ("all_reduce", "ps"): _all_reduce_ps,
           ("all_reduce", "dbtree"): _all_reduce_dbtree,
           ("all_reduce", "hierarchical"): _all_reduce_hierarchical,
           ("reduce", "ring"): _reduce_ring}

# The layouts that refuse some sizes, each with the predicate (n, nbytes of the
# collective's reference size) that it and applies() both use
LIMITS = {("reduce_scatter", "direct"): _eager_blocks, ("all_gather", "bruck"): _scratch_fits,
          ("broadcast", "pipeline"): _pipeline_fits, ("reduce", "ring"): _scratch_fits,
          ("reduce_scatter", "ring"): _scratch_fits, ("all_reduce", "hierarchical"): _pipeline_fits}


def applies(collective, algo, n, nbytes):
    """Whether a call of `collective` by `algo` on n ranks, nbytes each, runs on a
    prepared plan once it has run once (a contiguous buffer of a dtype with a C
    combine loop, no timeout=, no async_op): what the cost model asks before it
    charges the general path's own cost (cost.Params.call)."""
    if n < 2:
        return False
    pow2 = not n & (n - 1)
    if collective == "all_reduce":
        if algo == "recursive_doubling":
            return pow2 or nbytes <= MAX_TMP_BYTES
        if algo == "rabenseifner":
            return pow2 and nbytes <= _small.RANGED_MAX_BYTES
        if algo == "tree":
            return _one_segment(n, nbytes)
    if (collective, algo) not in LAYOUTS or nbytes > MAX_BYTES:
        return False
    limit = LIMITS.get((collective, algo))
    return limit is None or limit(n, nbytes)


def prepare(comm, st, key, kind, algo, count, dtype, nbytes, in_nbytes, sched_count,
            block, root=0, op=None, hook=0):
    """Remember a plan for calls like this one where the algorithm has a schedule
    and a layout here.  count: the fingerprint's; sched_count: the schedule's
    count argument; block: elements per block of the layout; nbytes/in_nbytes:
    the output's and the input's bytes (-1: none on this rank)."""
    from commrt.collectives import registry

    n, r = comm.size, comm.rank
    layout = LAYOUTS.get((kind, algo))
    mod = registry.module(kind, algo)
    if n < 2 or layout is None or not hasattr(mod, "schedule") or dtype not in DTYPE_CODE:
        return
    if max(nbytes, in_nbytes) > MAX_BYTES:
        return
    # calls like this one that could not have a plan are not tried again: building
    # the schedule and its layout costs more than the call (20-50 µs of Python)
    miss = st.cache.get("no plan")
    if miss is not None and (key, algo) in miss:
        return
    dtype = np.dtype(dtype)
    try:
        if hasattr(mod, "planned_phases"):      # a schedule that needs the communicator
            sched = mod.planned_phases(comm, st.cache, sched_count, dtype.itemsize)
        else:
            sched = _schedule(mod, n, r, sched_count, root, dtype.itemsize)
        steps, tmp_nbytes = layout(n, r, sched, block, dtype.itemsize, root, hook)
        if steps is not None and hasattr(mod, "copier_from"):
            # the module says who copies each receive by its peer (a variable-size
            # collective's exchanges of two unequal blocks): as its run does
            steps = _copied_from(lambda peer: mod.copier_from(comm.channel, st.cache, sched_count,
                                                              r, dtype.itemsize, peer), steps)
        elif steps is not None and hasattr(mod, "copier"):
            # the module says who copies each receive, by its size (a variable-size
            # collective's differ): as its run does
            steps = _copied_each(lambda nbytes: mod.copier(comm.channel, st.cache, nbytes),
                                 steps)
        if steps is not None and (tmp_nbytes or 0) <= MAX_TMP_BYTES:
            tmp = None if tmp_nbytes is None else aligned_empty(tmp_nbytes, np.uint8)
            avg = op is not None and op.name == "AVG"
            _small._keep(st, key, SchedPlan(comm, st, kind, algo, count, dtype, op, root, steps,
                                            tmp, max(nbytes, 0), max(in_nbytes, 0), avg))
            return
    except Exception as exc:
        # a plan is a shortcut: failing to build one (a layout's bug, no memory for its
        # scratch) must not fail the call on this rank alone while the others go on
        # and wait for it; the general path sends the plans' messages, so this rank
        # interoperates with the ranks that have one
        warnings.warn(f"commrt: {kind} ({algo}) runs without a prepared plan on rank {r}: "
                      f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
    if miss is None or len(miss) >= 4 * _small.MAX_PLANS:      # bounded
        miss = st.cache["no plan"] = set()
    miss.add((key, algo))


def _schedule(mod, n, r, count, root, itemsize):
    """The algorithm's schedule for this dtype: segmented ones (the ring's) cut
    their segments by bytes, as the runtime does (chunking.seg_elems)."""
    import inspect

    if "itemsize" in inspect.signature(mod.schedule).parameters:
        return mod.schedule(n, r, count, root, itemsize=itemsize)
    return mod.schedule(n, r, count, root)


def run(comm, st, plan, out, inbuf):
    """Run the collective along its plan: True, or False (having done nothing)
    when the buffers do not fit it (the caller takes the general path).
    (the compiled entry, collectives/_entry.pyx, runs these first lines itself,
    then finish.)"""
    seq = st.seq
    st.seq = seq + 1
    st.history.append((seq, plan.base, plan.meta2))    # (readers OR the seq in)
    return finish(comm, st, plan, seq, plan.chain.go(out, seq, inbuf), out, inbuf)


def finish(comm, st, plan, seq, i, out, inbuf):
    """The rest of run() once the chain's run returned i."""
    if i == plan.nsteps:
        if plan.large:
            plan.chain.release()
        if plan.avg and out is not None and (plan.kind != "reduce" or comm.rank == plan.root):
            _small._average(out, comm.size)
        return True
    if i < 0:
        st.seq = seq
        st.history.pop()
        return False
    _resume(comm, plan, seq, i, out, inbuf)
    if plan.avg and out is not None and (plan.kind != "reduce" or comm.rank == plan.root):
        _small._average(out, comm.size)
    return True


def _resume(comm, plan, seq, i, out, inbuf):
    """Finish the call from step i, whose requests the chain handed over, with a
    Call (same sequence number), message for message as the chain would."""
    reqs = plan.chain.handover()
    plan.chain.release()
    call = Call(comm, plan.kind, count=plan.count, dtype=plan.dtype, op=plan.op,
                root=plan.root, algo=plan.algo, seq=seq)

    def rest():
        views = [_flat(out, plan.dtype), _flat(inbuf, plan.dtype), _flat(plan.tmp, plan.dtype)]
        _finish_step(call, plan.steps[i], reqs)
        _after(plan, i, views)
        for j in range(i + 1, plan.nsteps):
            _run_step(call, plan.steps[j], views, plan.isz)
            _after(plan, j, views)

    call.run(rest)


def _after(plan, j, views):
    """Step j's combine after its messages, as the chain's hook does it."""
    after = plan.after[j]
    if after is not None:
        from commrt.kernels import combine_into

        combine_into(views[BUF], views[TMP], after[0], after[1])


def _flat(a, dtype):
    if a is None:
        return None
    return a.reshape(-1).view(np.uint8).view(dtype)


def _finish_step(call, step, reqs):
    it = iter(reqs)
    recvs = []
    for kind, peer, _, _, nbytes, *_ in step:
        if kind == COPY:
            continue
        q = next(it)
        if kind == SEND:
            call.sends.append((q, peer))
        else:
            recvs.append(Recv(q, peer, nbytes))
    call.waitall(recvs)
    call.wait_sends()


def _run_step(call, step, views, isz):
    recvs = []
    for kind, peer, where, off, nbytes, hook, *src in step:
        a = views[where][off // isz:(off + nbytes) // isz]
        if kind == COPY:
            s0 = src[1] // isz
            call.copy(a, views[src[0]][s0:s0 + nbytes // isz])
            continue
        copier = src[2] if len(src) > 2 else 0
        tag = src[3] if len(src) > 3 and src[3] >= 0 else TAG
        if kind == SEND:
            call.isend(a, peer, tag)
        elif hook:
            recvs.append(call.irecv_reduce(a, peer, hook, copier, tag))
        else:
            recvs.append(call.irecv(a, peer, copier, tag))
    call.waitall(recvs)
    call.wait_sends()
