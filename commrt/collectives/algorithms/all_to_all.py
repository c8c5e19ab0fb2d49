"""All-to-all: block j of rank i's buf becomes block i of rank j's out.

pairwise
  Post the N-1 receives (block from rank q into out[q]), then send block
  r+k to rank r+k for k = 1 .. N-1 (staggered so that no rank is every
  rank's first target), and copy one's own block.
  Cost: (N-1)·(α + |block|·β), the messages in flight together.
  Bytes sent per rank: (N-1)·|block|.
"""


def run(call, out, buf):
    n, r = call.size, call.rank
    m = buf.size // n
    rvs = [call.irecv(out[q * m:(q + 1) * m], q) for q in range(n) if q != r]
    for k in range(1, n):
        q = (r + k) % n
        call.isend(buf[q * m:(q + 1) * m], q)
    out[r * m:(r + 1) * m] = buf[r * m:(r + 1) * m]
    call.waitall(rvs)
