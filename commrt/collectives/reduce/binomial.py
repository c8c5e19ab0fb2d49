"""Binomial reduce (small messages).

Relative rank v = (r - root) mod N.  For mask = 1, 2, 4, ...: a rank with
v & mask sends its partial result to v - mask and stops; otherwise it
receives the partial result of v + mask (if it exists) and combines it in
(Call.recv_combine: as it lands where the reduction has a C loop), one child
after another in mask order.  Its senders' cores copy (copier SENDER: over
shared memory the messages stream through the rings whatever their size, the
sender copying while the receiver combines, where a receiver reading with
process_vm_readv would do both: 16 MiB at N = 2 took 1220 us against 1640).  Internal non-root nodes accumulate in
scratch, so non-root buffers stay unchanged.
Cost: ceil(log2 N)·(α + K·max(β, γ)) where every level's ranks have a core
(see cost).  Bytes: every non-root sends K once;
the root receives ceil(log2 N)·K at most.
"""

from commrt.collectives.registry import Msg, sender_copies
from commrt.comm import Channel

TIE = 0


def cost(n, nbytes, p, comm=None):
    """Level by level (mask 1, 2, 4, ...): the level's senders stream to their
    parents at once, each sender's core copying while its parent's combines, so
    a byte costs the slower of the two (max(β, γ)) where the level's ranks have
    a core each; beyond, its pairs share the cores (of all hosts).  Charged
    β + γ a byte, the model put the ring below binomial at N = 2 from 16 MiB
    and at N = 3 and 5 from 1 MiB, where binomial ran 1.3-3x faster (fresh
    inputs, 2026-12-04)."""
    if n == 1:
        return 0.0
    t, mask = 0.0, 1
    while mask < n:
        pairs = len(range(mask, n, 2 * mask))       # senders v with v & mask, lower bits 0
        t += p.nseg(nbytes) * p.step(2 * pairs) \
            + nbytes * max(p.beta, p.gamma) * max(1.0, 2 * pairs / (p.cores * p.hosts))
        mask <<= 1
    return t


def schedule(n, rank, count, root=0):
    """(the combines are the senders' copies: registry.sender_copies)"""
    v = (rank - root) % n
    steps = []
    mask = 1
    while mask < n:
        if v & mask:
            steps.append([Msg("send", (rank - mask) % n, 0, count)])
            break
        if v + mask < n:
            steps.append([Msg("combine", (rank + mask) % n, 0, count)])
        mask <<= 1
    return sender_copies(steps)


def reduce_to(call, buf, root, red, acc=None):
    """Binomial reduce of buf to root.  acc: where a non-root internal node may
    accumulate (default: a scratch copy, so buf stays unchanged); pass buf to
    reduce in place (reduce_bcast, hierarchical)."""
    n, r = call.size, call.rank
    v = (r - root) % n
    cur = buf
    mask = 1
    while mask < n:
        if v & mask:
            call.isend(cur, (r - mask) % n)
            return
        if v + mask < n:
            if cur is buf and v != 0 and acc is not buf:
                cur = call.state.scratch("bin_acc", buf.size, buf.dtype)
                call.copy(cur, buf)
            call.recv_combine(cur, (r + mask) % n, red, "bin_tmp", Channel.SENDER)
        mask <<= 1


def run(call, buf, root, red):
    if call.size > 1:
        reduce_to(call, buf, root, red)
