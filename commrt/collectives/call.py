"""Call: one collective call on one rank, the pair-like interface the algorithms
speak to (docs/algorithms.md, "The Call interface"): checked sends and
receives, receive-and-combine, exchanges, waits with deadlines and
mismatch probes.

Rules the algorithms follow (and this module enforces):

* Traffic goes through ``comm.channel`` (commrt.comm.Channel: the
  communicator's own context for collectives), tag ``TAG``.  Between
  two ranks messages of one (context, tag) match in the order sent, so an
  algorithm only has to post its receives from one peer in the order that
  peer sends.
* Each collective call gets the next sequence number of its communicator
  and a fingerprint (sequence, kind, algorithm, count, dtype, op, root).
  Every message carries the fingerprint packed in the header's two 64-bit
  words (``meta``, ``meta2``); every receive checks it and the payload size.  A difference is
  a mismatch: the rank that sees it aborts the collective context on every
  rank (``Channel.abort``), so each one raises CollectiveMismatchError naming
  both calls, and the context stays poisoned (later collectives raise too).
* Two mismatched calls can also leave ranks waiting on each other with no
  message in flight (rank 0 in reduce waiting on rank 1, rank 1 in
  broadcast waiting on rank 0).  A wait that lasts COMMRT_COLL_PROBE_S
  sends a probe (tag ``PROBE_TAG``) to the peer it waits on and listens
  for probes: a rank that receives a probe for a sequence number it has
  called compares fingerprints, and a difference aborts as above.  So a
  mismatch never hangs until the timeout.
* Collectives of one communicator run one at a time in call order (async
  ones on a worker thread; a blocking call waits for earlier async ones),
  so their messages never interleave; collectives of different
  communicators use different contexts and run concurrently.
* The thread rule: collectives of one communicator are entered by one
  thread at a time (``state.entry``).  A second thread entering while one is
  inside gets ConcurrentCollectiveError at once, naming both threads, before
  it touches any state (no sequence number taken, nothing sent): two
  threads' calls would take sequence numbers in a different order on each
  rank.  The async worker runs calls the owning thread queued: not a
  violation.  Point-to-point has no such rule.
* A collective that fails on one rank (timeout, lost peer, any error, Ctrl-C)
  aborts its collective context on every rank (``Call.fail_everywhere``)
  with a FailureCode and the culprit rank, so no rank carries on alone; the
  first abort wins everywhere, so every rank names the rank that failed
  first, not one that merely left after seeing it.

The fingerprint's codec is fingerprint.py, the per-communicator state and
the async worker state.py, the chunking helpers chunking.py.
"""
import array
import time

from commrt import _lazy

from commrt.collectives.fingerprint import (DTYPE_CODE, PROBE_TAG, SEQ_MASK, TAG, algo_code,
                                            describe_meta, diff, kind_code, pack)
from commrt.collectives.state import state_of
from commrt.comm import check_timeout
from commrt.errors import (AbortedError, CollectiveMismatchError, CommError, CommTimeoutError,
                           ConcurrentCollectiveError, FailureCode, MessageTruncatedError,
                           PeerLostError)
np = _lazy.module("numpy", globals(), "np")   # loaded on first use (a barrier needs none)


# -- one call ------------------------------------------------------------------------
class Recv:
    __slots__ = ("req", "src", "nbytes")

    def __init__(self, req, src, nbytes):
        self.req, self.src, self.nbytes = req, src, nbytes


class Combine:
    """A receive in flight that combines into buf once done (Call.irecv_combine)."""
    __slots__ = ("rv", "buf", "tmp", "red")

    def __init__(self, rv, buf, tmp, red):
        self.rv, self.buf, self.tmp, self.red = rv, buf, tmp, red


class Call:
    """One collective call on one rank: its fingerprint and its messages."""

    def __init__(self, comm, kind, *, count=0, dtype=None, op=None, root=0, algo="-",
                 timeout=None, seq=None, serving=None):
        """seq: the sequence number of a call already begun (and recorded) by the
        small-message path (collectives/_small.py), which hands it over here.
        serving: the user's collective (its kind) this internal call runs for, on
        every rank at the same point (calibrate): it takes the sequence number
        that call is about to take, without consuming it, so errors and
        sequence numbers name the user's calls only."""
        st = state_of(comm)
        if st.poisoned is not None:
            raise comm.channel.aborted() or AbortedError(f"communicator unusable after an "
                                                        f"earlier failure: {st.poisoned}")
        self.comm = comm
        self.chan = comm.channel
        self.state = st
        self.rank, self.size = comm.rank, comm.size
        resumed = seq is not None
        self.serving = serving
        if not resumed:
            seq = st.seq
            if serving is None:
                st.seq += 1
        self.seq = seq
        self.kind = kind
        self.algo = algo
        self.count = count
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.op = op
        self.root = root
        self.meta, self.meta2 = pack(
            self.seq, kind_code(kind), algo_code(kind, algo), count,
            DTYPE_CODE.get(self.dtype, 63) if self.dtype is not None else 0,
            op.value if op is not None else 0, root)
        if not resumed:
            st.history.append((self.seq, self.meta, self.meta2))
        self.timeout = st.timeout if timeout is None else check_timeout(timeout)
        self.deadline = None
        self.sends = []
        self.probe_s = st.probe_s
        self.worker = False                      # run by the async worker thread

    @property
    def spin(self):
        """Whether waits may spin before they sleep: not on the async worker while
        the caller computes (the spin would take the caller's core), yes once the
        caller itself waits for the result; not on a communicator set_spin(comm,
        False) marked (a helper thread's, which says itself when its caller waits)."""
        if self.worker:
            return self.state.waiters > 0
        return self.state.spin

    @property
    def name(self):
        if self.serving is not None:
            return f"{self.serving} #{self.seq} (its {self.kind})"
        return f"{self.kind} #{self.seq}"

    def start(self):
        self.deadline = time.monotonic() + self.timeout
        self.state.current = self

    def end(self):
        self.finish()
        # an abort that came in right behind the last message this rank matched
        # (its sender timed out waiting on another rank after posting it) fails
        # no request here: the call must still fail as every other rank's does.
        # Read first: a rank whose part only sent (eager messages complete at
        # post) has not driven the transport, so an abort already here is unread
        first = self.chan.aborted(read=True)
        if first is not None:
            raise first
        self.state.current = None

    def run(self, fn):
        """fn() as this call: started here, ended when fn returns; a failure is
        spread to every rank (fail_everywhere) and raised, and the communicator's
        current call is cleared either way."""
        self.start()
        try:
            result = fn()
            self.end()
            return result
        except BaseException as exc:
            err = self.fail_everywhere(exc)
            if err is exc:
                raise
            raise err from exc
        finally:
            self.state.current = None

    # messages ------------------------------------------------------------------------
    def copy(self, dst, src, answering=()):
        """A local copy (Channel.copy): an algorithm's own block.  answering: the
        receives (Recv) the call posted before it, whose senders that write them
        (copier SENDER) are told to meanwhile (Channel.copy_answering), not
        after the copy."""
        if answering:
            self.chan.copy_answering(dst, src, [rv.req for rv in answering])
        else:
            self.chan.copy(dst, src)

    def isend(self, buf, dst, tag=TAG):
        """tag: TAG, or a lane of this call's own (dbtree's trees: LANE_TAGS)."""
        req = self.chan.isend(buf, dst, tag, self.meta, self.meta2)
        self.sends.append((req, dst))
        return req

    def irecv(self, buf, src, copier=0, tag=TAG):
        """copier: who copies a large message over shared memory (Channel.irecv):
        Channel.RECEIVER where the sender's core has other copies to make (a
        scatter's root), Channel.SENDER where this rank's has (a gather's
        root); the messages are the same."""
        return Recv(self.chan.irecv(buf, src, tag, copier), src, buf.nbytes)

    def irecv_reduce(self, buf, src, hook, copier=0, tag=TAG):
        """Receive into buf combining (buf = buf OP message) as the data lands, with
        the C loop at address hook (``reduce.hook``); checked by wait like any
        receive, and buf is untouched unless the message is the one expected.
        copier Channel.SENDER: the sender's core copies (over shared memory the
        message streams through the ring at any size) while this one combines:
        where nothing else moves meanwhile (a reduce's tree)."""
        return Recv(self.chan.irecv_reduce(buf, src, tag, self.meta, hook, self.meta2, copier),
                    src, buf.nbytes)

    def recv(self, buf, src, copier=0):
        self.wait(self.irecv(buf, src, copier))

    def irecv_combine(self, buf, src, red, slot, copier=0, tag=TAG):
        """Start receiving a message from src to combine into buf (buf = buf OP
        message, the message the right operand): a reduce-receive where red has
        a C loop, else a receive into the scratch `slot` that wait_combine
        reduces from.  Two combines in flight need different slots.  copier:
        as irecv_reduce's."""
        if red.hook:
            return Combine(self.irecv_reduce(buf, src, red.hook, copier, tag), buf, None, red)
        tmp = self.state.scratch(slot, buf.size, buf.dtype)
        return Combine(self.irecv(tmp, src, copier, tag), buf, tmp, red)

    def wait_combine(self, cb):
        """Wait for an irecv_combine (checked as by wait) and finish its combine."""
        self.wait(cb.rv)
        if cb.tmp is not None:
            cb.red(cb.buf, cb.tmp)

    def recv_combine(self, buf, src, red, slot="combine", copier=0, tag=TAG):
        """Receive from src and combine the message into buf (see irecv_combine)."""
        self.wait_combine(self.irecv_combine(buf, src, red, slot, copier, tag))

    def send(self, buf, dst):
        """Start a send; it completes by end() (the algorithm must not modify buf before)."""
        self.isend(buf, dst)

    def wait(self, rv):
        """Wait for a receive and check its fingerprint and size."""
        st = self._wait_req(rv.req, rv.src)
        if st.meta != self.meta or st.meta2 != self.meta2 or st.nbytes != rv.nbytes:
            self._mismatch(rv.src, (st.meta, st.meta2), st.nbytes, rv.nbytes)
        return st

    def exchange(self, sbuf, dst, rbuf, src, hook=0):
        """Send sbuf to dst and receive rbuf from src (checked as by wait); the
        send completes by end() or wait_sends().  One engine call when the
        answer comes within the probe interval, as it does in a healthy run.
        hook: combine the message into rbuf instead (as irecv_reduce)."""
        # the async worker beside a computing caller only posts here (the engine's
        # wait spins); complete_exchange then waits without spinning
        wait = self.probe_s if self.spin else 0.0
        try:
            rq, sq = self.chan.exchange(sbuf, dst, rbuf, src, TAG, self.meta, wait, hook,
                                        self.meta2)
        except CommError as exc:
            self._failed(exc, src)
        return self.complete_exchange(rq, sq, src, rbuf.nbytes, dst)

    def exchange_combine(self, sbuf, dst, rbuf, src, red, slot="xcombine"):
        """exchange() whose received message is combined into rbuf (rbuf = rbuf OP
        message): as it lands where red has a C loop, else through scratch."""
        if red.hook:
            return self.exchange(sbuf, dst, rbuf, src, red.hook)
        tmp = self.state.scratch(slot, rbuf.size, rbuf.dtype)
        st = self.exchange(sbuf, dst, tmp, src)
        red(rbuf, tmp)
        return st

    def complete_exchange(self, rq, sq, src, nbytes, dst=None):
        """Finish an exchange already posted (by exchange(), or by the small path
        before it handed the call over): wait for the receive and check it.
        dst: where sq goes (default src)."""
        self.sends.append((sq, src if dst is None else dst))
        st = self._wait_req(rq, src)
        if st.meta != self.meta or st.meta2 != self.meta2 or st.nbytes != nbytes:
            self._mismatch(src, (st.meta, st.meta2), st.nbytes, nbytes)
        return st

    def waitall(self, recvs):
        for rv in recvs:
            self.wait(rv)

    def test(self, rv):
        """True when the receive finished (checked as by wait)."""
        try:
            done = rv.req.test()
        except CommError as exc:
            self._failed(exc, rv.src)
        if done:
            self.wait(rv)
        return done

    def wait_sends(self, first=None):
        """Wait for the sends posted so far (or for the first `first` of them; the
        later ones stay to be waited for by end())."""
        if first is None:
            sends, self.sends = self.sends, []
        else:
            sends, self.sends = self.sends[:first], self.sends[first:]
        for req, dst in sends:
            self._wait_req(req, dst)    # a timeout names the rank that did not take it

    def finish(self):
        self.wait_sends()

    # waiting -------------------------------------------------------------------------
    def _wait_req(self, req, peer):
        now = time.monotonic()
        probe_at = now + self.probe_s
        while True:
            now = time.monotonic()
            left = self.deadline - now
            if left <= 0:
                raise CommTimeoutError(self.name, peer, TAG, self.timeout,
                                       detail=f"rank {self.rank} of {self.size}")
            try:
                return req.wait(min(left, max(probe_at - now, 0.001)), self.spin)
            except CommTimeoutError:
                if req.done:
                    # done as the slice ran out, or failed: by the abort of another
                    # rank's timeout, which makes this same class (then the call
                    # fails now, not at the next probe)
                    return self._finished(req, peer)
            except CommError as exc:
                self._failed(exc, peer)
            if time.monotonic() >= probe_at:
                # aborted meanwhile (another rank failed) while this request was
                # already matched, so the abort did not fail it: stop waiting
                first = self.chan.aborted()
                if first is not None:
                    raise first
                self._probe(peer)
                probe_at = time.monotonic() + min(self.probe_s, 0.5)

    def _finished(self, req, peer):
        """The status of a request that is done, or its own failure raised."""
        try:
            return req.wait(0)
        except CommError as exc:
            self._failed(exc, peer)

    def _failed(self, exc, peer):
        """A request of this call failed with exc: raise what this rank reports
        (the abort of every rank happens in fail_everywhere)."""
        if isinstance(exc, MessageTruncatedError):
            fp = ((self.meta, self.meta2) if exc.meta is None
                  else (exc.meta, getattr(exc, "meta2", 0) or 0))
            self._mismatch(exc.source, fp, exc.message_bytes, exc.buffer_bytes)
        raise exc

    def fail_everywhere(self, exc):
        """The call failed here with exc: abort the collective context on every
        rank (the code and culprit travel with it), and return the error to
        raise: the first failure heard, if another rank's abort came first."""
        if isinstance(exc, ConcurrentCollectiveError):
            return exc
        told = getattr(exc, "origin", None) is not None      # made from a received abort
        if told or isinstance(exc, AbortedError):
            self._relay_abort()
        else:
            code, culprit = FailureCode.ERROR, self.rank
            if isinstance(exc, PeerLostError):
                code, culprit = FailureCode.PEER_LOST, exc.rank
            elif isinstance(exc, CommTimeoutError):
                code, culprit = FailureCode.TIMEOUT, exc.peer if exc.peer is not None else self.rank
            elif isinstance(exc, CommError):
                code = exc.code
            self._abort_here(exc, code, culprit)
        try:
            first = self.chan.aborted()
        except CommError:
            first = None
        if self.state.poisoned is None:
            self.state.poisoned = str(first if first is not None else exc)
        if told or first is None or first.origin == self.rank:
            return exc                      # ours is the first failure (or the one we heard)
        return first                        # another rank failed first: name its culprit

    def _abort_here(self, exc, code, culprit):
        """Abort this call's context on every rank for exc (its code and culprit
        travel with it)."""
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        reason = f"rank {self.rank} in {self.name}: {what}"[:250]
        try:
            self.chan.abort(reason, code=code, culprit=culprit)
        except CommError:
            pass

    def _relay_abort(self):
        """This rank was told of a failure (another rank's abort): pass the first
        abort on to every rank before this one can leave.  A rank waiting on
        this one then hears the culprit before it sees this rank go (the
        messages of one channel arrive in order), so it never blames this
        rank; the abort it was sent by the rank that failed first may come on
        another channel, later.  (The engine sends the abort it holds: the
        first heard, whatever is passed here.)"""
        try:
            if self.chan.aborted() is not None:
                self.chan.abort("relayed", code=FailureCode.ERROR, culprit=None)
        except CommError:
            pass

    def _mismatch(self, src, fp, nbytes, expected):
        reason = self._differs(src, fp, nbytes, expected)
        self._abort_everywhere(f"collective mismatch: {reason}")

    def _differs(self, src, fp, nbytes, expected):
        """What differs between this call and the message of rank src (its
        fingerprint fp = (meta, meta2), nbytes) that this rank received for it."""
        ours = (self.meta, self.meta2)
        mine = describe_meta(*ours, serving=self.serving)
        if self.state.tuning is not None:       # a trial call of collectives/tuning.py
            mine = f"{self.state.tuning} (tuning: {mine})"
        if fp == ours:
            return (f"rank {self.rank} called {mine}; rank {src} sent {self._bytes(nbytes)} "
                    f"where this rank expected {self._bytes(expected)} from it (their counts "
                    f"differ)")
        seq = fp[0] & SEQ_MASK
        earlier = None
        if seq != self.seq:
            earlier = next((e for e in reversed(self.state.history)
                            if e[0] == seq and e[0] != self.seq), None)
        if earlier is None:
            return (f"rank {self.rank} called {mine}; rank {src} called {describe_meta(*fp)} "
                    f"[{', '.join(diff(ours, fp))} differ]")
        # a message of an earlier call nobody received in it (every rank only sent,
        # e.g. each passed itself as a broadcast's root): that call was the mismatch
        theirs = (earlier[1] | (seq & SEQ_MASK), earlier[2])   # a plan's entry: its base
        fields = [f for f in diff(theirs, fp) if f != "seq"] or ["count"]
        # (kept short: the abort carries the reason to every rank in 255 bytes)
        return (f"in the earlier call #{earlier[0]} [{', '.join(fields)} differ]: rank "
                f"{self.rank} called {describe_meta(*theirs)}, rank {src} "
                f"{describe_meta(*fp)}; no rank received in it, {self.name} saw it")

    def _bytes(self, nbytes):
        dt = self.dtype
        if dt is None or not dt.itemsize or nbytes % dt.itemsize:
            return f"{nbytes} B"
        return f"{nbytes} B ({nbytes // dt.itemsize} x {dt.name})"

    def _abort_everywhere(self, reason):
        self.state.poisoned = reason
        try:
            self.chan.abort(reason)
        except CommError:
            pass
        raise CollectiveMismatchError(reason, rank=self.rank, origin=self.rank)

    # probes ----------------------------------------------------------------------------
    def _probe(self, peer):
        """Tell `peer` what we are waiting in, and answer probes sent to us."""
        st = self.state
        if peer is not None:
            msg = array.array("Q", (self.meta, self.meta2))     # uint64, as probe_buf
            try:
                self.chan.isend(msg, peer, PROBE_TAG, self.meta, self.meta2)
            except CommError:
                pass
        check_probes(st, self)


def check_probes(st, call):
    """Handle probes that arrived: a probe for a sequence number this rank has
    called with a different fingerprint is a mismatch (abort); others are
    ignored (the prober is only waiting for a slower rank)."""
    from commrt.errors import CommError as _CE

    chan = call.chan
    while True:
        if st.probe_req is None:
            st.probe_req = chan.irecv(st.probe_buf, -1, PROBE_TAG)
        try:
            if not st.probe_req.test():
                return
            status = st.probe_req.wait(0)
        except CollectiveMismatchError as exc:
            st.probe_req = None
            call._failed(exc, None)
        except _CE:
            st.probe_req = None
            return
        st.probe_req = None
        if st.calibrating:
            # every rank makes the calibration's calls alike, so nothing in it is a
            # mismatch; a probe from a rank past it, in its own call at the number
            # the calibration shares (or that its internal calls take and give
            # back), cannot be judged before we make ours: it probes again, and a
            # real mismatch shows then
            continue
        theirs = (int(st.probe_buf[0]), int(st.probe_buf[1]))
        seq = theirs[0] & SEQ_MASK
        # every call this rank made at that sequence number (an internal call,
        # calibrate, shares its user call's): a mismatch if none is theirs
        ours = [(meta | (s & SEQ_MASK), meta2) for s, meta, meta2 in st.history if s == seq]
        if ours and theirs not in ours:
            mine = ours[-1]
            serving = call.serving if mine == (call.meta, call.meta2) else None
            reason = (f"collective mismatch: rank {call.rank} called "
                      f"{describe_meta(*mine, serving=serving)}; "
                      f"rank {status.source} called {describe_meta(*theirs)} "
                      f"[{', '.join(diff(mine, theirs)) or 'count'} differ]")
            call._abort_everywhere(reason)



class Members:
    """A Call as its ranks `members` see it: rank i of the group is the call's
    rank members[i].  An algorithm written for a whole communicator runs on a
    group of the call's ranks through it (hierarchical's host reduce, leaders'
    ring and host broadcast): its messages are the call's own, on its context,
    with its fingerprint and deadline, so a mismatch, a lost peer or an abort
    fails the call as it does any other, and errors name the call's ranks.
    Waits and everything else are the call's (__getattr__)."""

    def __init__(self, call, members):
        self._call, self._members = call, members
        self.rank, self.size = members.index(call.rank), len(members)

    def __getattr__(self, name):
        return getattr(self._call, name)

    def isend(self, buf, dst, tag=TAG):
        return self._call.isend(buf, self._members[dst], tag)

    def send(self, buf, dst):
        self._call.send(buf, self._members[dst])

    def irecv(self, buf, src, copier=0, tag=TAG):
        return self._call.irecv(buf, self._members[src], copier, tag)

    def recv(self, buf, src, copier=0):
        self._call.recv(buf, self._members[src], copier)

    def irecv_reduce(self, buf, src, hook, copier=0, tag=TAG):
        return self._call.irecv_reduce(buf, self._members[src], hook, copier, tag)

    def irecv_combine(self, buf, src, red, slot, copier=0, tag=TAG):
        return self._call.irecv_combine(buf, self._members[src], red, slot, copier, tag)

    def recv_combine(self, buf, src, red, slot="combine", copier=0, tag=TAG):
        self._call.recv_combine(buf, self._members[src], red, slot, copier, tag)

    def exchange(self, sbuf, dst, rbuf, src, hook=0):
        return self._call.exchange(sbuf, self._members[dst], rbuf, self._members[src], hook)

    def exchange_combine(self, sbuf, dst, rbuf, src, red, slot="xcombine"):
        return self._call.exchange_combine(sbuf, self._members[dst], rbuf, self._members[src],
                                           red, slot)

    def complete_exchange(self, rq, sq, src, nbytes, dst=None):
        return self._call.complete_exchange(rq, sq, self._members[src], nbytes,
                                            None if dst is None else self._members[dst])
