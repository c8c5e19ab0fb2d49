"""Reduce-scatter: buf holds N blocks; rank i gets block i reduced over all ranks (in out).

direct (small messages)
  Send block j to rank j for every j != r (all at once), receive the N-1
  copies of block r and reduce them with one pass (float16 accumulates in
  float32 across all of them).  Where the reduction has a C loop the copies
  are reduce-receives instead, combined into out (our own block first) as
  they land, one peer after another in the pass's order: no scratch, no pass.
  Cost: (N-1)·α + (N-1)/N·K·β + (N-1)/N·K·γ, all messages in flight together.
  Bytes sent per rank: (N-1)·|block|.

ring (large messages)
  N-1 steps: at step s send the partial block r-s-1 to the right, receive
  the partial block r-s-2 from the left and reduce one's own copy into it;
  the last step's receive lands in out, so rank r ends with block r.
  Segmented like the all-reduce ring.  buf is never written.
  Cost: (N-1)·(α + K/N·β + K/N·γ).  Bytes sent per rank: (N-1)·|block|.
"""
from commrt.collectives._engine import seg_elems, segments

ALGORITHMS = ("direct", "ring")


def cost(algo, n, nbytes, p):
    if n == 1:
        return 0.0
    block = nbytes / n
    if algo == "direct":
        return (n - 1) * (p.alpha + block * (p.beta + p.gamma)) * p.rho(n)
    return (n - 1) * (p.nseg(block) * p.alpha + block * (p.beta + p.gamma)) * p.rho(n)


def direct(call, out, buf, reduce, reduce_many):
    n, r = call.size, call.rank
    m = out.size
    peers = [q for q in range(n) if q != r]
    hook = getattr(reduce, "hook", 0)
    if hook:
        # Each peer's copy is combined into out as it lands (no send reads
        # out), in peer order as the pass adds them: the next peer's receive
        # is posted once the previous one completed, since reduce-receives
        # posted together would combine in arrival order.  Its message waits
        # in the transport meanwhile (the receiver copies a large one anyway).
        out[...] = buf[r * m:(r + 1) * m]
        rv = call.irecv_reduce(out, peers[0], hook)
        for k in range(1, n):
            q = (r + k) % n
            call.isend(buf[q * m:(q + 1) * m], q)
        call.wait(rv)
        for q in peers[1:]:
            call.wait(call.irecv_reduce(out, q, hook))
        return
    tmps = [call.state.scratch(("rsd", q), m, buf.dtype) for q in range(n - 1)]
    rvs = [call.irecv(t, q) for t, q in zip(tmps, peers)]
    for k in range(1, n):
        q = (r + k) % n
        call.isend(buf[q * m:(q + 1) * m], q)
    out[...] = buf[r * m:(r + 1) * m]
    call.waitall(rvs)
    reduce_many(out, tmps)


def ring(call, out, buf, reduce):
    n, r = call.size, call.rank
    m = out.size
    right, left = (r + 1) % n, (r - 1) % n
    seg = seg_elems(buf.itemsize)
    pieces = segments(0, m, seg)
    tmp = (call.state.scratch("rsr0", m, buf.dtype), call.state.scratch("rsr1", m, buf.dtype))

    def target(s):  # where step s's incoming partial block lands
        return out if s == n - 2 else tmp[s % 2]

    def post(s):
        t = target(s)
        return [(lo, hi, call.irecv(t[lo:hi], left)) for lo, hi in pieces]

    c0 = (r - 1) % n
    for lo, hi in pieces:
        call.isend(buf[c0 * m + lo:c0 * m + hi], right)
    nxt = post(0)
    for s in range(n - 1):
        cur = nxt
        last = s == n - 2
        if not last:
            call.wait_sends()  # tmp[(s+1)%2] was forwarded from at step s-1
            nxt = post(s + 1)
        c = (r - s - 2) % n
        t = target(s)
        for lo, hi, rv in cur:
            call.wait(rv)
            reduce(t[lo:hi], buf[c * m + lo:c * m + hi])
            if not last:
                call.isend(t[lo:hi], right)


def run(algo, call, out, buf, reduce, reduce_many):
    n = call.size
    if n == 1:
        out[...] = buf
        return
    if algo == "direct":
        direct(call, out, buf, reduce, reduce_many)
    else:
        ring(call, out, buf, reduce)
