"""Linear scatter.

The root sends block i to rank i (all at once, staggered from root+1) and
copies its own; every other rank receives its block.  Who copies a block
over shared memory (Call.irecv's copier, ``copier`` below):

* where each rank has a core, the receiver (RECEIVER), straight from the
  root's buffer: the root's core copies only its own block while the
  receivers copy theirs, in parallel;
* where the group's ranks outnumber the host's cores, below the
  transport's single-copy threshold (Channel.cma_min, 1 MiB there), the
  root (SENDER, process_vm_writev): one copy a block, all on the root's
  core, which is running anyway, while a receiver need only be woken to
  post its buffer and again when its block is in.  Reading needs every
  receiver on a core to copy while the root waits for all of them.
  ``bench collectives --kinds scatter --fresh-inputs``, 2 cores, the three
  alternated three times (2026-12-05, load 0.7-2.5), µs, ranges of the
  three: N = 3 2 MiB read 292-455, streamed 266-331, written 192-210; N = 4
  1 MiB 167-201, 135-166, 148-164, 2 MiB 326-537, 377-394, 339-410; N = 6
  256 KiB 58-59, 54-82, 41-92; N = 8 1 MiB 309-373, 317-387, 304-329.
  From the threshold up the receivers read, the transport splitting each
  copy with the root's core (N = 4 16 MiB: read 2.5-3.2 ms, written
  3.1-3.6).
Cost: (N-1)·α + (N-1)·K_block·β at the root.  Bytes: the root sends
(N-1)·|block|; every other rank receives |block|.
"""
from commrt.collectives.cost import written_where_crowded
from commrt.collectives.registry import Msg
from commrt.comm import Channel


def cost(n, nbytes, p, comm=None):
    return 0.0 if n == 1 else (n - 1) * (p.alpha + nbytes / n * p.beta)


def schedule(n, rank, count, root=0):
    """count: elements per block; positions in the root's buf (a receiver's: its out)."""
    m = count
    if n == 1:
        return []
    if rank != root:
        return [[Msg("recv", root, 0, m)]]
    return [[Msg("send", (root + k) % n, (root + k) % n * m, ((root + k) % n + 1) * m)
             for k in range(1, n)]]


def copier(chan, cache, nbytes):
    """The copier of a receiver's block of nbytes (Channel.irecv's), the same on
    the general path and in the plan (plans.prepare): SENDER where this host's
    ranks of the group outnumber its cores and the block is below the
    transport's single-copy threshold, else RECEIVER (the module's text)."""
    return written_where_crowded(chan, cache, nbytes, Channel.RECEIVER)


def run(call, out, buf, root):
    n, r = call.size, call.rank
    m = out.size
    if r != root:
        call.recv(out, root, copier(call.chan, call.state.cache, out.nbytes))
        return
    for k in range(1, n):
        q = (root + k) % n
        call.isend(buf[q * m:(q + 1) * m], q)
    call.copy(out, buf[root * m:(root + 1) * m])
