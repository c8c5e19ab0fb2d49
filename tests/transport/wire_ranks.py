"""Rank-side functions of the wire tests (header words, flow control, liveness)."""
import numpy as np

from commrt.kernels import combine_address

TAG = 21
HI = (1 << 64) - 1


def meta_words(comm, nbytes):
    """Both 64-bit words of meta reach the receiver's Status, eagerly and by
    rendezvous, through send, isend, sendrecv and a reduce-receive (which
    combines only when both words match)."""
    peer = 1 - comm.rank
    out = {}
    payload = np.full(nbytes, comm.rank + 1, np.uint8)
    got = np.empty(nbytes, np.uint8)
    if comm.rank == 0:
        comm.send(payload, peer, TAG, meta=HI, meta2=HI - 1)
        comm.isend(payload, peer, TAG, meta=1, meta2=1 << 63).wait(30)
    else:
        st = comm.recv(got, peer, TAG, timeout=30)
        out["send"] = (st.meta, st.meta2)
        st = comm.recv(got, peer, TAG, timeout=30)
        out["isend"] = (st.meta, st.meta2)
    st = comm.sendrecv(payload, peer, got, peer, TAG + 1, meta=5, meta2=comm.rank + 7, timeout=30)
    out["sendrecv"] = (st.meta, st.meta2)
    hook = combine_address("sum", np.dtype(np.uint8))
    for mine, theirs in ((3, 3), (3, 4)):           # the second: meta2 differs on rank 0
        acc = np.full(nbytes, 10, np.uint8)
        word2 = theirs if comm.rank == 0 else mine
        rq = comm._irecv_reduce(acc, peer, TAG + 2, 9, hook, meta2=mine)
        sq = comm.isend(payload, peer, TAG + 2, meta=9, meta2=word2)
        st = rq.wait(30)
        sq.wait(30)
        out[f"reduce{theirs}"] = (st.meta2, bool(np.all(acc == 10 + (2 - comm.rank))),
                                  bool(np.all(acc == 10)))
    return out
