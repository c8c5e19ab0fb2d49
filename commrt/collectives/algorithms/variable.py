"""Variable-size collectives: every rank's block has its own element count.

Blocks are packed in rank order (block q at offset counts[0] + ... +
counts[q-1]); a zero count is an empty message, still sent and checked, so
a rank whose counts disagree with a peer's gets CollectiveMismatchError
naming the sizes, never a hang.

all_gatherv direct
  Copy one's block into out; receive every other rank's block straight into
  its place in out and send one's own block to every other rank, all at
  once (to r+k, from r-k, k = 1 .. N-1).
  Cost: α_busy + (N-2)·α + (K - |own block|)·β.  Bytes sent per rank:
  (N-1)·|own block|.

all_gatherv ring
  Copy one's block into out; at step s send block r-s to the right and
  receive block r-s-1 from the left straight into out (N-1 steps).
  Cost: (N-1)·α + (K - |own block|)·β (the largest block sets each step).
  Bytes sent per rank: K - |block r+1|.

gatherv / scatterv linear
  The root posts all N-1 transfers at once (each block to or from its place
  in the root's packed buffer) and copies its own; every other rank sends
  or receives its one block.  Cost at the root: (N-1)·α + (K - |own|)·β.

all_to_allv pairwise
  Post the N-1 receives (recv_counts[q] elements from rank q into its place
  in out), send send_counts[q] elements to each rank q = r+k, k = 1 .. N-1
  (staggered so no rank is everyone's first target), copy one's own block.
  Cost: (N-1)·α + max(bytes in, bytes out)·β.  Bytes sent per rank:
  sum of send_counts less one's own.
"""

ALLGATHERV = ("direct", "ring")


def offsets(counts):
    """Start of each block in a packed buffer, and the total, for counts."""
    offs = [0] * (len(counts) + 1)
    for i, c in enumerate(counts):
        offs[i + 1] = offs[i] + c
    return offs


def all_gatherv_cost(algo, n, nbytes, p):
    if n == 1:
        return 0.0
    block = nbytes / n
    if algo == "direct":
        return p.step(n) + (n - 2) * p.alpha + (n - 1) * block * p.beta * p.rho(n)
    return (n - 1) * (p.step(n) + block * p.beta * p.rho(n))


class AllGathervModule:
    """What cost.choose needs for all_gatherv: its algorithms and their costs."""
    __name__ = "all_gatherv"
    ALGORITHMS = ALLGATHERV

    @staticmethod
    def cost(algo, n, nbytes, p):
        return all_gatherv_cost(algo, n, nbytes, p)


def all_gatherv(algo, call, out, buf, counts):
    n, r = call.size, call.rank
    offs = offsets(counts)
    out[offs[r]:offs[r + 1]] = buf
    if n == 1:
        return
    if algo == "direct":
        rvs = []
        for k in range(1, n):
            q = (r - k) % n
            rvs.append(call.irecv(out[offs[q]:offs[q + 1]], q))
        for k in range(1, n):
            call.isend(buf, (r + k) % n)
        call.waitall(rvs)
        return
    right, left = (r + 1) % n, (r - 1) % n
    rvs = []
    for s in range(n - 1):
        c = (r - s - 1) % n
        rvs.append(call.irecv(out[offs[c]:offs[c + 1]], left))
    call.isend(out[offs[r]:offs[r + 1]], right)
    for s in range(n - 1):
        call.wait(rvs[s])
        if s < n - 2:
            c = (r - s - 1) % n
            call.isend(out[offs[c]:offs[c + 1]], right)


def gatherv(call, buf, out, counts, root):
    n, r = call.size, call.rank
    if r != root:
        call.isend(buf, root)
        return
    offs = offsets(counts)
    rvs = [call.irecv(out[offs[q]:offs[q + 1]], q) for q in range(n) if q != root]
    out[offs[root]:offs[root + 1]] = buf
    call.waitall(rvs)


def scatterv(call, out, buf, counts, root):
    n, r = call.size, call.rank
    if r != root:
        call.recv(out, root)
        return
    offs = offsets(counts)
    for k in range(1, n):
        q = (root + k) % n
        call.isend(buf[offs[q]:offs[q + 1]], q)
    out[...] = buf[offs[root]:offs[root + 1]]


def all_to_allv(call, out, buf, send_counts, recv_counts):
    n, r = call.size, call.rank
    so, ro = offsets(send_counts), offsets(recv_counts)
    rvs = [call.irecv(out[ro[q]:ro[q + 1]], q) for q in range(n) if q != r]
    for k in range(1, n):
        q = (r + k) % n
        call.isend(buf[so[q]:so[q + 1]], q)
    out[ro[r]:ro[r + 1]] = buf[so[r]:so[r + 1]]
    call.waitall(rvs)


