"""One rank of a fault job (run by commrt-launch; see harness.py).

Every rank runs the same random stream of collectives (oracle.py), each
checked against NumPy.  The culprit rank injects its fault during the stream:

    kill   SIGKILL itself                  stop  SIGSTOP itself
    slow   sleep --sleep seconds, then go on (inside a collective)

at a random point: --where call fires at the --at-th point-to-point call the
collectives make (inside a collective, between two of its messages); --where
timer fires from a thread --at seconds into the stream, wherever the rank is.

Each rank writes what it saw to DIR/rank<R>.json (the culprit also writes
DIR/fault.json just before the fault): the exception's class and MRO, the
rank it names, when, and the process's descriptors and threads before init
and after close (a leak check after the fault).  SIGTERM from the launcher is
noted, not obeyed, so every rank gets to report what it saw itself; the
launcher's SIGKILL after --grace still ends a rank that cannot.
"""
import argparse
import faulthandler
import json
import os
import re
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402

P2P_CALLS = ("send", "recv", "isend", "irecv", "sendrecv", "_exchange", "_irecv_reduce",
             "_exchange_chain")


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--results", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--culprit", type=int, default=-1)
    p.add_argument("--fault", choices=("kill", "stop", "slow", "none"), default="none")
    p.add_argument("--where", choices=("call", "timer"), default="call")
    p.add_argument("--at", type=float, default=1)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--ops", type=int, default=10 ** 6)
    p.add_argument("--max-seconds", type=float, default=120.0)
    p.add_argument("--ready", default="", help="file created when this rank starts its stream")
    return p.parse_args()


def write_json(path, obj):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def named_rank(exc):
    """The rank an error blames: its culprit/rank/peer attribute, else 'rank N' in the text."""
    for attr in ("culprit", "rank", "peer"):
        v = getattr(exc, attr, None)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v
    m = re.search(r"rank (\d+)", str(exc))
    return int(m.group(1)) if m else None


def counts():
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task"))}


class Fault:
    def __init__(self, args, rank):
        self.args, self.rank = args, rank
        self.fired = False
        self.calls = 0
        self.op = None

    def fire(self):
        if self.fired:
            return
        self.fired = True
        a = self.args
        write_json(os.path.join(a.results, "fault.json"),
                   {"rank": self.rank, "pid": os.getpid(), "fault": a.fault, "where": a.where,
                    "t": time.time(), "op": self.op, "calls": self.calls})
        if a.fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif a.fault == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif a.fault == "slow":
            time.sleep(a.sleep)

    def arm(self, comm):
        """Count the point-to-point calls of this rank's collectives; fire at the chosen one."""
        if self.args.where == "timer":
            def later():
                time.sleep(self.args.at)
                self.fire()
            threading.Thread(target=later, daemon=True).start()
            return
        for target in (comm, comm._coll):
            for name in P2P_CALLS:
                method = getattr(target, name, None)
                if method is not None:
                    setattr(target, name, self._counted(method))

    def _counted(self, method):
        def call(*a, **kw):
            self.calls += 1
            if self.calls >= self.args.at:
                self.fire()
            return method(*a, **kw)
        return call


def main():
    args = parse()
    sigterm = []
    signal.signal(signal.SIGTERM, lambda *_: sigterm.append(time.time()))
    # a rank still running when the launcher gives up on it says where it is: every
    # thread's stack, from C (it works while the main thread is inside the engine)
    stacks = open(os.path.join(args.results, f"stacks.{os.getpid()}"), "w")
    faulthandler.register(signal.SIGTERM, file=stacks, all_threads=True, chain=True)
    import commrt
    import commrt.collectives  # noqa: F401 - loaded before the counts, as init leaves it

    before = counts()
    comm = commrt.init()
    rank, size = comm.rank, comm.size
    record = {"rank": rank, "pid": os.getpid(), "size": size, "before": before,
              "transport": {q: comm.transport_of(q) for q in range(size)}}
    fault = Fault(args, rank) if rank == args.culprit and args.fault != "none" else None
    comm.barrier()                       # everyone is up before any fault
    if args.ready:
        open(f"{args.ready}.{rank}", "w").close()
    if fault is not None:
        fault.arm(comm)
    start, i, s, error = time.monotonic(), 0, None, None
    try:
        for i in range(args.ops):
            if time.monotonic() - start > args.max_seconds:
                raise RuntimeError(f"no error within {args.max_seconds:g} s ({i} ops)")
            s = oracle.spec(args.seed, i, size)
            if fault is not None:
                fault.op = i
            oracle.run(comm, s)
        record.update(status="ok", ops=args.ops)
    except Exception as exc:  # noqa: BLE001 - what the rank saw is the result
        record.update(status="error", t=time.time(), exc=type(exc).__name__,
                      mro=[c.__name__ for c in type(exc).__mro__], named=named_rank(exc),
                      message=str(exc)[:2000], op=i, coll=s and s["coll"])
        error = exc
    record["elapsed"] = time.monotonic() - start
    comm.close()
    record["after"] = counts()
    record["sigterm"] = sigterm[0] if sigterm else None
    write_json(os.path.join(args.results, f"rank{rank}.json"), record)
    if error is not None:
        raise error          # the traceback goes to the launcher, as in any program
    return 0


if __name__ == "__main__":
    sys.exit(main())
