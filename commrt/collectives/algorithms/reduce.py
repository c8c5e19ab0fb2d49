"""Reduce: every rank's buffer combined element-wise, the result at the root.

Non-root buffers are left unchanged (internal nodes reduce into scratch).

binomial (small messages)
  Relative rank v = (r - root) mod N.  For mask = 1, 2, 4, ...: a rank with
  v & mask sends its partial result to v - mask and stops; otherwise it
  receives the partial result of v + mask (if it exists) and reduces it in
  (a reduce-receive, combined as it lands, where the reduction has a C
  loop; else received into scratch and reduced).
  Cost: ceil(log2 N)·(α + K·β + K·γ).  Bytes: every non-root sends K once;
  the root receives ceil(log2 N)·K at most.

ring (large messages: Rabenseifner's reduce)
  A ring reduce-scatter (as in all_reduce ring, on a scratch copy) leaves
  each rank one chunk of N fully reduced; each sends it to the root.
  Cost: (N-1)·α + (N-1)/N·K·β + (N-1)/N·K·γ  +  α + K/N·β (gather; the root
  receives N-1 chunks).  Bytes: each non-root sends (N-1)/N·K + K/N (less
  its own chunk sizes when N does not divide the count).
"""
import math

from commrt.collectives.allreduce import ring as ring_allreduce

ALGORITHMS = ("binomial", "ring")


def cost(algo, n, nbytes, p):
    if n == 1:
        return 0.0
    if algo == "binomial":
        return math.ceil(math.log2(n)) * (p.nseg(nbytes) * p.alpha + nbytes * (p.beta + p.gamma))
    chunk = nbytes / n
    step = p.nseg(chunk) * p.alpha + chunk * p.beta
    return p.rho(n) * ((n - 1) * (step + chunk * p.gamma)) + (n - 1) * chunk * p.beta + p.alpha


def binomial(call, buf, root, reduce, acc=None):
    """Binomial reduce of buf to root.  acc: where a non-root internal node may
    accumulate (default: a scratch copy, so buf stays unchanged); pass buf to
    reduce in place."""
    n, r = call.size, call.rank
    v = (r - root) % n
    cur = buf
    tmp = None
    # With a C loop each child's partial result is combined into cur as it
    # lands: cur is sent only after the last child's, and the children are
    # received one after another, in mask order as from scratch.
    hook = getattr(reduce, "hook", 0)
    mask = 1
    while mask < n:
        if v & mask:
            call.isend(cur, (r - mask) % n)
            return
        if v + mask < n:
            if cur is buf and v != 0 and acc is not buf:
                cur = call.state.scratch("bin_acc", buf.size, buf.dtype)
                cur[...] = buf
            if hook:
                call.wait(call.irecv_reduce(cur, (r + mask) % n, hook))
            else:
                if tmp is None:
                    tmp = call.state.scratch("bin_tmp", buf.size, buf.dtype)
                call.recv(tmp, (r + mask) % n)
                reduce(cur, tmp)
        mask <<= 1


def ring(call, buf, root, reduce):
    n, r = call.size, call.rank
    if r == root:
        work = buf
    else:
        work = call.state.scratch("red_work", buf.size, buf.dtype)
        work[...] = buf
    b = ring_allreduce.reduce_scatter(call, work, reduce)
    # rank q owns chunk q+1: send it to the root, which receives every other chunk
    own = (r + 1) % n
    if r != root:
        call.isend(work[b[own]:b[own + 1]], root)
    else:
        call.wait_sends()
        rvs = [call.irecv(buf[b[(q + 1) % n]:b[(q + 1) % n + 1]], q) for q in range(n) if q != root]
        call.waitall(rvs)


def run(algo, call, buf, root, reduce):
    if call.size > 1:
        if algo == "binomial":
            binomial(call, buf, root, reduce)
        else:
            ring(call, buf, root, reduce)
