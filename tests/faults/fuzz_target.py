"""A real transport Engine whose peers this process plays, fed fuzz cases by a parent.

The engine is rank 0 of a world whose other ranks are slots played here:
rank 1 is the witness (only ever sends valid frames, after every case, to
prove the engine still works for its other peers), ranks 2.. take one case
each.  Over TCP a slot is a loopback connection; over shared memory it is a
pair segment (memfd), the engine's doorbell and a liveness socket, exactly
what connect.py hands the engine after authentication.

Before a case's bytes, each slot has the engine in a state where every
opcode means something: a small and a large receive posted from the slot, a
large send to it waiting for CTS (its id read from the engine's RTS), and
one rendezvous begun by the slot (the receive's id read from the engine's
CTS).  Frame fields may name those ids symbolically ($send, $recv), the
next sequence number ($seq) or the slot's rank ($src).

The verdict of a case: whether the engine dropped the slot and why, what
each of the slot's requests became (a commrt error class, done, pending, or
anything else: a defect), the unexpected-message bytes held, and the
witness's check.  A crash or a hang of this process is seen by the parent.
"""
import mmap
import os
import socket
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RING = 16384
SMALL, LARGE = 4096, 32768
TAG_SMALL, TAG_LARGE, TAG_SEND, TAG_WITNESS = 5, 6, 9, 1
# Each slot's requests live in a context of their own ($ctx = its rank): an ABORT
# frame poisons its context engine-wide, as it should, and must not spill over
# into the next case or the witness's context.
WITNESS_CTX = 0x5A5A5A5A
RTS_COOKIE = 777
GUARD, GUARD_BYTE = 4096, 0xA5
HARNESS_WAIT_S = 15.0        # the harness's own waits: generous, a loaded host is slow
# the control page of a pair segment (shm.pxi): side 1's producer words and side 0's
OFF_HEAD0, OFF_TAIL0, OFF_HEAD1, OFF_TAIL1 = 256, 320, 384, 448
CTL_PAGE = 4096
U64 = struct.Struct("<Q")
GRANT = 1 << 22              # credit a slot grants the engine, where the engine takes one


def adopt(add, *args):
    """engine.add_*_peer(*args): with flow control (wire version 2) the call also takes
    the credit the peer grants; engines before it take none."""
    try:
        return add(*args, GRANT)
    except TypeError:
        return add(*args)


def _tcp_pair():
    """(our socket, the engine's end: non-blocking, TCP_NODELAY) over loopback."""
    lst = socket.create_server(("127.0.0.1", 0))
    ours = socket.create_connection(lst.getsockname())
    theirs, _ = lst.accept()
    lst.close()
    theirs.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    theirs.setblocking(False)
    return ours, theirs


class TcpSlot:
    """A TCP peer.  lane=True: the pair also has an extra stream (COMMRT_TCP_STREAMS),
    and a case's bytes go on that stream, which may carry only DATA and BYE; the
    set-up's frames and the engine's replies stay on the first connection."""

    def __init__(self, eng, rank, lane=False):
        from wire import FrameReader

        self.sock, server = _tcp_pair()
        lanes = ()
        self.lane = None
        if lane:
            self.lane, lane_end = _tcp_pair()
            lanes = (lane_end,)
        adopt(lambda *a: eng.add_tcp_peer(*a, lanes=tuple(x.fileno() for x in lanes)),
              rank, server.fileno())
        for x in (server, *lanes):
            x.detach()
        self.reader = FrameReader(self.sock)
        self.rank = rank

    def write(self, blob, tail=None):
        self._send(self.sock, blob)

    def write_case(self, blob, tail=None):
        self._send(self.lane or self.sock, blob)

    @staticmethod
    def _send(sock, blob):
        sock.settimeout(2.0)
        try:
            sock.sendall(blob)
        except OSError:
            pass                    # the engine stopped reading: it dropped us

    def read(self, timeout=HARNESS_WAIT_S):
        return self.reader.read(timeout)


class ShmSlot:
    """The peer side (side 1) of a pair segment: writes the engine's receive ring."""

    def __init__(self, eng, rank):
        from commrt.transport import _core

        seg = _core.shm_segment_bytes(RING)
        fd = os.memfd_create(f"fuzz-{rank}", os.MFD_CLOEXEC)
        os.ftruncate(fd, seg)
        self.mem = mmap.mmap(fd, seg)
        self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)   # "my" doorbell
        self.live, theirs = socket.socketpair()
        theirs.setblocking(False)
        adopt(eng.add_shm_peer, rank, os.dup(fd), RING, 0, os.dup(self.efd), theirs.fileno(),
              os.getpid(), False)
        theirs.detach()
        os.close(fd)
        self.doorbell = eng.doorbell_fd
        self.rank = rank
        self.rx = CTL_PAGE + RING           # engine's receive ring: side 1's transmit ring
        self.tx = CTL_PAGE                  # engine's transmit ring

    def _u64(self, off, value=None):
        if value is None:
            return U64.unpack_from(self.mem, off)[0]
        U64.pack_into(self.mem, off, value)

    def write(self, blob, tail=None):
        """Copy records (already laid out) into the ring at our tail and publish them."""
        t = self._u64(OFF_TAIL1)
        head = self._u64(OFF_HEAD1)
        room = RING - (t - head)
        off = t & (RING - 1)
        blob = blob[:min(room, RING - off)]
        self.mem[self.rx + off:self.rx + off + len(blob)] = blob
        self._u64(OFF_TAIL1, t + len(blob) if tail is None else tail)
        os.eventfd_write(self.doorbell, 1)

    write_case = write

    def read(self, timeout=HARNESS_WAIT_S):
        """The next record the engine wrote to us (header fields, payload)."""
        from wire import OPCODES, SLOT, parse, record_len

        end = time.monotonic() + timeout
        while True:
            head, tail = self._u64(OFF_HEAD0), self._u64(OFF_TAIL0)
            if head != tail:
                off = head & (RING - 1)
                h = parse(self.mem[self.tx + off:self.tx + off + SLOT])
                if h["opcode"] == OPCODES["PAD"]:
                    self._u64(OFF_HEAD0, head + SLOT + h["nbytes"])
                    continue
                plen = h["nbytes"] if h["opcode"] in (OPCODES["EAGER"], OPCODES["DATA"],
                                                      OPCODES["ABORT"]) else 0
                payload = bytes(self.mem[self.tx + off + SLOT:self.tx + off + SLOT + plen])
                self._u64(OFF_HEAD0, head + record_len(plen))
                return h, payload
            if time.monotonic() > end:
                raise TimeoutError("the engine wrote nothing to this slot")
            time.sleep(0.0002)


def layout(kind, frames):
    """Bytes of frames [(header bytes, payload)]: a TCP stream or ring records."""
    from wire import SLOT, record_len

    out = bytearray()
    for hdr, payload in frames:
        if kind != "shm":
            out += hdr + payload
        else:
            rec = bytearray(record_len(len(payload)))
            rec[:len(hdr)] = hdr
            rec[SLOT:SLOT + len(payload)] = payload
            out += rec
    return bytes(out)


class Target:
    def __init__(self, kind, nslots):
        from commrt.transport import _core

        self.kind = kind
        self.size = nslots + 2
        # heartbeat_s=0: no heartbeat thread (its BEAT frames and silence checks
        # would land on the fuzzer's hand-played peers)
        self.eng = _core.Engine(0, self.size, eager_limit=16384, timeout=10.0, heartbeat_s=0)
        # "lane": TCP with an extra stream per slot (rank 1, the witness, has none)
        if kind == "shm":
            self.slots = {r: ShmSlot(self.eng, r) for r in range(1, self.size)}
        else:
            self.slots = {r: TcpSlot(self.eng, r, lane=kind == "lane" and r > 1)
                          for r in range(1, self.size)}
        self.eng.start(progress_thread=True)
        self.next = 2
        self.witness_seq = 0
        self.keep = []                      # requests and buffers of past cases

    # -- one case
    def prepare(self, slot):
        """Post the slot's requests and begin both rendezvous; returns the ids."""
        from wire import OPCODES, header

        e, r = self.eng, slot.rank
        ctx = r
        # an earlier case's forged ABORT may have named this context (any ctx value
        # is a valid abort): this slot starts from a live one
        e.clear_poison(ctx)
        # receive buffers between guard bytes: a write out of bounds shows up there
        small = np.full(SMALL + 2 * GUARD, GUARD_BYTE, np.uint8)[GUARD:-GUARD]
        large = np.full(LARGE + 2 * GUARD, GUARD_BYTE, np.uint8)[GUARD:-GUARD]
        small[:] = 0
        large[:] = 0
        out = np.arange(LARGE, dtype=np.uint8)
        reqs = [("recv-small", e.irecv(small, r, ctx, TAG_SMALL)),
                ("recv-large", e.irecv(large, r, ctx, TAG_LARGE)),
                ("send-large", e.isend(out, r, ctx, TAG_SEND))]
        self.keep.append((small, large, out, reqs))
        self.guarded = (small, large)
        h = self.next_frame(slot)
        assert h["opcode"] == OPCODES["RTS"] and h["src"] == 0, h
        send_id = h["cookie"]
        slot.write(layout(self.kind, [(header(opcode=OPCODES["RTS"], src=r, ctx=ctx,
                                              tag=TAG_LARGE, nbytes=LARGE, cookie=RTS_COOKIE),
                                       b"")]))
        e.progress()
        h = self.next_frame(slot)
        assert h["opcode"] == OPCODES["CTS"] and h["cookie"] == RTS_COOKIE, h
        return {"$send": send_id, "$recv": h["addr"], "$src": r, "$ctx": ctx}, reqs

    @staticmethod
    def next_frame(slot):
        """The engine's next frame to this slot other than credit and heartbeats."""
        from wire import OPCODES

        quiet = {OPCODES.get("CREDIT"), OPCODES.get("BEAT")} - {None}
        while True:
            h, _ = slot.read()
            if h["opcode"] not in quiet:
                return h

    def run_case(self, case):
        from wire import header

        if self.next >= self.size:
            return {"exhausted": True}
        slot = self.slots[self.next]
        self.next += 1
        ids, reqs = self.prepare(slot)
        seq = self.first_seq()
        frames, first = [], None
        for fields, payload in case["frames"]:
            values = {}
            for name, v in fields.items():
                if v == "$seq":
                    v = seq
                elif isinstance(v, str):
                    v = ids[v]
                values[name] = v
            seq += 1
            frames.append((header(**values), payload))
            first = values if first is None else first
        blob = bytearray(layout(self.kind, frames) + case.get("raw", b""))
        for pos, xor in case.get("flips", ()):
            if blob:
                blob[pos % len(blob)] ^= xor
        if case.get("cut") is not None and blob:
            blob = blob[:case["cut"] % (len(blob) + 1)]
        tail = case.get("tail")
        if tail is not None:            # a bogus tail: an offset from the real one
            tail = (tail + self._tail(slot)) % (1 << 64)
        slot.write_case(bytes(blob), tail=tail)
        self.settle(slot)
        v = self.verdict(slot, reqs)
        untouched = not case.get("flips") and case.get("cut") is None and tail is None
        v["foreign_first"] = first is not None and untouched and self.foreign(first, slot.rank)
        return v

    def foreign(self, h, rank):
        """A header (its field values) that is plainly not commrt's for this slot."""
        from wire import MAGIC, OPCODES, VERSION

        if h.get("magic", MAGIC) != MAGIC or h.get("version", VERSION) != VERSION:
            return True
        pad = h["opcode"] == OPCODES["PAD"]
        if h["opcode"] not in OPCODES.values() or (self.kind != "shm" and pad):
            return True
        if self.kind == "lane" and h["opcode"] not in (OPCODES["DATA"], OPCODES["BYE"]):
            return True                     # an extra stream carries only these
        if pad:
            return False
        if h["src"] != rank or h["seq"] != self.first_seq():
            return True
        # longer than the credit the engine grants: no sender may send it (on shared
        # memory it overruns the ring as well)
        return h["opcode"] == OPCODES["EAGER"] and h["nbytes"] > self.eng.credit_bytes

    def first_seq(self):
        """The sequence number the case's first frame must carry: the set-up sent
        one frame (an RTS) on the slot's connection, none on its extra stream."""
        return 0 if self.kind == "lane" else 1

    def _tail(self, slot):
        return slot._u64(OFF_TAIL1) if self.kind == "shm" else 0


    def settle(self, slot):
        """Drive the engine until it has taken in what it was given."""
        last, quiet = None, 0
        end = time.monotonic() + 2.0
        while quiet < 2 and time.monotonic() < end:
            self.eng.progress()
            now = (self.eng.stats()[slot.rank]["header_bytes_recv"], self.eng.peer_lost(slot.rank))
            quiet = quiet + 1 if now == last else 0
            last = now
            os.sched_yield()

    def verdict(self, slot, reqs):
        from commrt.errors import CommError

        v = {"lost": self.eng.peer_lost(slot.rank), "requests": {}, "defects": []}
        for name, q in reqs:
            try:
                v["requests"][name] = "done" if q.test() else "pending"
            except CommError as exc:
                v["requests"][name] = type(exc).__name__
            except BaseException as exc:  # noqa: BLE001 - anything but a commrt error is a defect
                v["defects"].append(f"{name}: {type(exc).__name__}: {exc}")
        for name, buf in zip(("recv-small", "recv-large"), self.guarded):
            whole = buf.base
            if (whole[:GUARD] != GUARD_BYTE).any() or (whole[-GUARD:] != GUARD_BYTE).any():
                v["defects"].append(f"{name}: the engine wrote outside the receive buffer")
        v["unexpected_bytes"] = self.eng.memory_info()["unexpected_bytes"]
        v["poisoned"] = self.eng.poison_of(slot.rank) is not None     # its context aborted
        v["witness"] = self.witness()
        return v

    def witness(self):
        """A valid message from the untouched peer still arrives, intact."""
        from wire import OPCODES, header

        w = self.slots[1]
        payload = self.witness_seq.to_bytes(8, "little")
        got = np.zeros(8, np.uint8)
        q = self.eng.irecv(got, 1, WITNESS_CTX, TAG_WITNESS)
        w.write(layout(self.kind, [(header(opcode=OPCODES["EAGER"], src=1, ctx=WITNESS_CTX,
                                           tag=TAG_WITNESS,
                                           seq=self.witness_seq, nbytes=8), payload)]))
        self.witness_seq += 1
        try:
            q.wait(HARNESS_WAIT_S)
        except Exception as exc:  # noqa: BLE001
            return f"{type(exc).__name__}: {exc}"
        return "ok" if got.tobytes() == payload else f"corrupted: {got.tobytes()!r}"


def serve(conn, kind, nslots):
    """Child main: build the target, answer cases until told to stop."""
    try:
        target = Target(kind, nslots)
    except BaseException as exc:  # noqa: BLE001
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            case = conn.recv()
        except EOFError:
            break
        if case is None:
            break
        try:
            conn.send(("verdict", target.run_case(case)))
        except BaseException:  # noqa: BLE001 - the harness itself broke: say so
            import traceback
            conn.send(("error", traceback.format_exc()))
            break
    os._exit(0)          # the engine's linger for queued frames is of no interest here
