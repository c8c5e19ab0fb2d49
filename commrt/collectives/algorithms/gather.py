"""Gather and scatter: one block per rank to or from the root (linear).

gather:  every rank sends its block to the root, which posts all N-1
         receives at once (into out, in rank order) and copies its own.
scatter: the root sends block i to rank i (all at once) and copies its own;
         every other rank receives its block.
Cost: (N-1)·α + (N-1)·K_block·β at the root (its link carries everything;
a tree would not move fewer bytes through it).  Bytes: the root receives
(gather) or sends (scatter) (N-1)·|block|; every other rank sends or
receives |block|.
"""


def gather(call, buf, out, root):
    n, r = call.size, call.rank
    m = buf.size
    if r != root:
        call.isend(buf, root)
        return
    rvs = [call.irecv(out[q * m:(q + 1) * m], q) for q in range(n) if q != root]
    out[root * m:(root + 1) * m] = buf
    call.waitall(rvs)


def scatter(call, out, buf, root):
    n, r = call.size, call.rank
    m = out.size
    if r != root:
        call.recv(out, root)
        return
    for k in range(1, n):
        q = (root + k) % n
        call.isend(buf[q * m:(q + 1) * m], q)
    out[...] = buf[root * m:(root + 1) * m]
