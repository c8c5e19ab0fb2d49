"""All-gather: every rank's buffer, in rank order, on every rank (out holds N blocks).

bruck (small messages), any N
  Work in a scratch of N blocks holding, at position i, the block of rank
  r+i.  Step k (d = 2^k): send the first min(d, N-d) blocks to rank r-d,
  receive as many from rank r+d into positions d..; after ceil(log2 N)
  steps rotate the scratch into out.
  Cost: ceil(log2 N)·α + (N-1)/N·K·β (K = bytes of out) + K·β (the rotation copy).
  Bytes sent per rank: (N-1)·|block|.

ring (large messages)
  Copy one's block into out; at step s send block r-s to the right and
  receive block r-s-1 from the left straight into out (N-1 steps).
  Cost: (N-1)·(α + K/N·β).  Bytes sent per rank: (N-1)·|block|.

direct (large messages, more ranks than cores)
  Copy one's block into out; receive every other rank's block straight into
  out and send one's own to every other rank, all at once (to r+k, from
  r-k, k = 1 .. N-1, so no rank is everyone's first target).  One round
  instead of the ring's N-1 dependent steps: where a rank must wait for a
  context switch before it can forward (ranks outnumber cores), that wait
  is paid once; on shared memory a large block is read by its receiver
  with process_vm_readv, without its sender being scheduled.
  Cost: α_busy + (N-2)·α + (N-1)/N·K·β.  Bytes sent per rank: (N-1)·|block|.
"""
import math

ALGORITHMS = ("bruck", "ring", "direct")


def cost(algo, n, nbytes, p):
    if n == 1:
        return 0.0
    block = nbytes / n
    if algo == "bruck":  # plus the final rotation: one local copy of K
        return (math.ceil(math.log2(n)) * p.alpha + (n - 1) * block * p.beta * p.rho(n)
                + nbytes * p.beta)
    if algo == "direct":  # one round: one wait for the slowest peer, N-1 messages posted
        return p.step(n) + (n - 2) * p.alpha + (n - 1) * block * p.beta * p.rho(n)
    # ring: every step waits on the left neighbour's forward
    return (n - 1) * (p.step(n) + block * p.beta * p.rho(n))  # one message per block


def ring(call, out, buf):
    n, r = call.size, call.rank
    m = buf.size
    out[r * m:(r + 1) * m] = buf
    if n == 1:
        return
    right, left = (r + 1) % n, (r - 1) % n
    rvs = []
    for s in range(n - 1):
        c = (r - s - 1) % n
        rvs.append(call.irecv(out[c * m:(c + 1) * m], left))
    call.isend(out[r * m:(r + 1) * m], right)
    for s in range(n - 1):
        call.wait(rvs[s])
        if s < n - 2:
            c = (r - s - 1) % n
            call.isend(out[c * m:(c + 1) * m], right)


def bruck(call, out, buf):
    n, r = call.size, call.rank
    m = buf.size
    if n == 1:
        out[:m] = buf
        return
    work = call.state.scratch("bruck", n * m, buf.dtype)
    work[:m] = buf
    d = 1
    while d < n:
        cnt = min(d, n - d)
        rv = call.irecv(work[d * m:(d + cnt) * m], (r + d) % n)
        call.isend(work[:cnt * m], (r - d) % n)
        call.wait(rv)
        d <<= 1
    call.wait_sends()
    # work[i] is the block of rank r+i
    out[r * m:] = work[:(n - r) * m]
    out[:r * m] = work[(n - r) * m:n * m]


def direct(call, out, buf):
    n, r = call.size, call.rank
    m = buf.size
    out[r * m:(r + 1) * m] = buf
    rvs = []
    for k in range(1, n):
        q = (r - k) % n
        rvs.append(call.irecv(out[q * m:(q + 1) * m], q))
    for k in range(1, n):
        call.isend(buf, (r + k) % n)
    call.waitall(rvs)


def run(algo, call, out, buf):
    {"bruck": bruck, "ring": ring, "direct": direct}[algo](call, out, buf)
