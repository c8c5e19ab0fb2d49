"""Every COMMRT_* knob, with its default, read in one place.

Values are read from the environment when asked for (not at import), so a
test or a launcher may set them before ``commrt.init()``.  ``describe()``
lists them all; docs/configuration.md is generated from the same table.
"""
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict


@dataclass(frozen=True)
class Knob:
    name: str
    default: Any
    parse: Callable[[str], Any]
    doc: str
    empty: Any = None       # the value when set to "" (None: the same as unset)
    empty_is_value: bool = False


def _bool(text):
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false), got {text!r}")


def _size(text):
    """Bytes, with an optional K/M/G suffix (powers of 1024)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if scale > 1 else t) * scale)


def _size_or_auto(text):
    return "auto" if text.strip().lower() == "auto" else _size(text)


KNOBS: Dict[str, Knob] = {}


def knob(name, default, parse, doc, **empty):
    """Declare a knob.  empty=VALUE: what setting it to "" means, where that
    differs from leaving it unset (e.g. a cache path set empty: no cache)."""
    KNOBS[name] = Knob(name, default, parse, doc, empty.get("empty"), "empty" in empty)


# -- bootstrap (rendezvous) ------------------------------------------------
knob("COMMRT_RANK", None, int, "This process's rank in the world (set by commrt-launch).")
knob("COMMRT_WORLD_SIZE", None, int, "Number of ranks in the world.")
knob("COMMRT_LOCAL_RANK", None, int, "Rank among the ranks on this host.")
knob("COMMRT_LOCAL_WORLD_SIZE", None, int, "Number of ranks on this host.")
knob("COMMRT_STORE_ADDR", None, str, "host:port of the rendezvous store.")
knob("COMMRT_SECRET_FD", None, int,
     "Number of an inherited descriptor (a memfd) holding the job secret: how commrt-launch "
     "hands it to its ranks, so no secret file exists on disk; read once, then closed.")
knob("COMMRT_SECRET_FILE", None, str, "Path of a file (mode 0600) holding the job secret.")
knob("COMMRT_SECRET", None, str, "The job secret itself (hex); prefer COMMRT_SECRET_FILE.")
knob("COMMRT_HOST_ID", None, str,
     "Name that groups ranks by host (default: the hostname, or Slurm's node name, with the "
     "network namespace appended when it is not the machine's own).")
knob("COMMRT_IFNAME", None, str,
     "Network interface(s) of the data plane across hosts, and of the address rank 0 "
     "advertises for its store under torchrun/mpirun/srun: comma-separated names or name "
     "prefixes (eth, ib0,eth1), exact names first (default: the interface that routes to the "
     "store's host).")
knob("COMMRT_RENDEZVOUS_DIR", None, str,
     "Directory (shared between hosts) where rank 0 publishes the store address and secret "
     "under torchrun/mpirun/srun when no secret is given; default /tmp/commrt-UID on one host, "
     "~/.commrt/rendezvous across hosts.")
knob("COMMRT_STORE_BIND", None, str,
     "Address rank 0 binds the store to under torchrun/mpirun/srun (default: loopback on one "
     "host, all interfaces across hosts).")
knob("COMMRT_RESTART_COUNT", None, int,
     "Which attempt of the job a rank belongs to, set by commrt-launch: 0, then 1, 2, ... "
     "after --max-restarts restarts (TORCHELASTIC_RESTART_COUNT holds the same).")
# -- transport -------------------------------------------------------------
knob("COMMRT_TIMEOUT", 300.0, float, "Default deadline in seconds of every blocking call.")
knob("COMMRT_TRANSPORT", "auto", str,
     "auto (shared memory on one host, TCP across hosts), shm, or tcp (forces TCP on one host).")
knob("COMMRT_BIND_ADDR", "127.0.0.1", str, "Address the data-plane listener binds (TCP).")
knob("COMMRT_EAGER_LIMIT", 16384, _size, "Largest message sent eagerly (copied through the channel).")
knob("COMMRT_UNEXPECTED_BYTES", 4 << 20, _size,
     "Bytes of unexpected messages (arrived before their receive was posted) a rank holds for "
     "each peer, at least 64 KiB: the eager credit it grants that peer.  A sender out of credit "
     "waits until the receiver matches (a blocking send may then wait for its receive, as MPI "
     "allows: use sendrecv or non-blocking sends for exchanges).")
knob("COMMRT_HEARTBEAT_S", 0.5, float,
     "Seconds between two heartbeats of a rank's transport to each peer (a counter in shared "
     "memory, a 64-byte BEAT frame over an idle TCP link), sent by a C thread that never "
     "needs the GIL; must be > 0 (peers would find a rank without heartbeats silent).")
knob("COMMRT_LIVENESS_TIMEOUT_S", 8.0, float,
     "A peer not heard from for this many seconds (stopped, frozen, or its link cut) is "
     "lost: pending and later operations on it fail with PeerUnresponsiveError naming it.  "
     "A rank computing or sleeping keeps beating.  0: never (only exits and resets count).")
knob("COMMRT_SHM_RING_BYTES", 1 << 20, _size, "Bytes of each shared-memory ring, per direction.")
knob("COMMRT_SHM_CHUNK_BYTES", 64 << 10, _size,
     "Bytes per piece of a large shared-memory message streamed through the pair's ring "
     "(below COMMRT_CMA_MIN_BYTES): the receiver copies or combines one piece while the "
     "sender writes the next, so smaller pieces overlap more (256 KiB -> 64 KiB took a 2-rank "
     "1 MiB all-reduce from 55 to 41 us); rounded down to a multiple of 64.")
knob("COMMRT_TCP_STREAMS", 2, int,
     "TCP connections per pair of ranks on different hosts, 1-8 (each pair uses the smaller "
     "of its two ranks' values).  With 2 or more, a large message's DATA is striped over the "
     "extra ones in 1 MiB pieces and the first keeps the small, urgent frames (eager messages, "
     "rendezvous replies, credit, heartbeats: matching order is the first's), so a reply never "
     "waits in the kernel behind DATA.  Measured in docs/transport.md.")
knob("COMMRT_CMA", True, _bool, "Use process_vm_readv (single copy) for large shared-memory messages.")
knob("COMMRT_CMA_MIN_BYTES", "auto", _size_or_auto,
     "Smallest shared-memory message copied with process_vm_readv; smaller ones (above the "
     "eager limit) stream through the pair's ring in chunks: two cache-hot copies, on both "
     "cores at once, beat one process_vm_readv up to ~1 MiB.  auto: 2 MiB, or 1 MiB "
     "when a host's ranks outnumber its cores (streaming needs the sender scheduled too).  "
     "A collective may choose per receive (docs/transport.md, who copies).")
knob("COMMRT_SPIN_US", 50.0, float,
     "Microseconds a waiter spins before it sleeps, at least (see COMMRT_OVERSUB_SPIN_US).")
knob("COMMRT_OVERSUB_SPIN_US", 50.0, float,
     "Microseconds a waiter spins, yielding the core at every pass, before it sleeps, when a "
     "host's ranks outnumber its cores (those their affinity masks hold together: ranks each "
     "pinned to a core of their own are not outnumbering them).")
knob("COMMRT_OVERSUB_SPIN_MAX_US", 250.0, float,
     "Where a host's ranks outnumber its cores: the largest spin a prepared collective's step "
     "learns when its answers keep arriving just after its waiter fell asleep (each step "
     "learns its own; COMMRT_OVERSUB_SPIN_US to turn learning off).")
knob("COMMRT_SPIN_MAX_US", 10000.0, float,
     "Largest spin a waiter adapts to when answers keep arriving just after it fell asleep.  "
     "It must cover a scheduler time slice (a few ms): beside a busy process, the peer we wait "
     "for is descheduled that long, and a waiter that sleeps leaves its core idle for that "
     "process to move onto (an 8-byte all-reduce at N = 2 beside one busy loop: 2-33 us "
     "with 1 ms, 0.76-1.2 with 10 ms; OpenMPI 0.73: docs/performance-collectives.md).")
knob("COMMRT_PROGRESS_THREAD", True, _bool, "Run a background progress thread for non-blocking operations.")
knob("COMMRT_PROGRESS_DELAY_US", 1000.0, float,
     "Grace before the progress thread takes over requests a caller left outstanding.")
# -- kernels and collectives ------------------------------------------------
knob("COMMRT_KERNEL_PARALLEL_BYTES", 0, _size,
     "Arrays from this size up are reduced on several threads (Numba's thread count); 0: never (measured on 2 cores: they pay only when the other core is idle).")
knob("COMMRT_CONV_CHUNK_BYTES", 512 << 10, _size,
     "With one Numba thread, convolutions that do not take the Winograd path run im2col and "
     "the product on a chunk of images at a time whose columns and products fit in this many "
     "bytes (kept in the core's L2 cache, 1 MiB on the 2-core host; see "
     "kernels/conv_chunked.py); 0: the whole batch at once (one large column matrix), as with "
     "more threads.")
knob("COMMRT_<COLLECTIVE>_ALGO", "", str,
     "Force the algorithm of one collective, read on every call: COMMRT_ALL_REDUCE_ALGO, "
     "COMMRT_BROADCAST_ALGO, COMMRT_REDUCE_ALGO, COMMRT_ALL_GATHER_ALGO, ... (one per "
     "collective; the names are listed in docs/algorithms.md, generated from "
     "commrt/collectives/registry.py); COMMRT_ALLREDUCE_ALGO is an alias of "
     "COMMRT_ALL_REDUCE_ALGO; empty: the cost model chooses.")
knob("COMMRT_COST_CACHE", "~/.cache/commrt/cost.json", str,
     "File caching the measured alpha/beta/gamma per transport (empty: measure every job); "
     "an entry settles once two jobs' measurements agree, each job measuring until then.",
     empty=None)
knob("COMMRT_TUNE", True, _bool,
     "Choose the algorithm of large calls (from COMMRT_TUNE_MIN_BYTES) by timing the cost "
     "model's plausible candidates once per size class (a power of two) and communicator, "
     "inside the first such call; the winners are kept in COMMRT_COST_CACHE and settle "
     "once two jobs' measurements agree: a later job then times the winner alone and "
     "measures all again only where its speed moved (0: the model alone).")
knob("COMMRT_TUNE_MIN_BYTES", 4 << 20, _size,
     "Smallest call (its reference bytes, as the cost model's) whose algorithm is measured.")
knob("COMMRT_RING_SEGMENT_BYTES", 256 << 10, _size,
     "Segment size of pipelined collectives (ring, tree, chain): reduce one while the next moves.")
knob("COMMRT_SWITCH_INTERVAL_US", 500.0, float,
     "Python's thread switch interval (sys.setswitchinterval) once a collective runs with "
     "async_op=True: its worker thread needs the GIL between messages, and Python's default "
     "5 ms lets a computing thread hold it that long.  0 leaves the interval alone.")
knob("COMMRT_COLL_PROBE_S", 1.0, float,
     "Seconds a collective waits before probing its peers for a mismatched call (deadlock check).")
knob("COMMRT_TIMELINE", "", str, "Record a Chrome-trace timeline of this rank to this path (`{rank}` becomes the rank); commrt-launch --timeline sets it per rank.")
# -- Horovod API (commrt.horovod; Horovod's own names, read only by that layer) --------
knob("HOROVOD_FUSION_THRESHOLD", 128 << 20, _size,
     "Bytes of one fusion buffer: ready allreduces of one dtype and op are packed into "
     "buffers of at most this size and reduced together; 0 turns fusion off.")
knob("HOROVOD_CYCLE_TIME", 50.0, float,
     "Milliseconds between the coordinator's negotiation rounds while tensors are pending "
     "and the caller computes (ops submitted within one cycle fuse); a caller that waits "
     "gets rounds at once. Horovod's default is 1: each round here costs the training "
     "thread the GIL and a core (docs/horovod.md).")
knob("HOROVOD_CACHE_CAPACITY", 1024, int,
     "Entries of the response cache (a steady step skips negotiation); 0 turns it off.")
knob("COMMRT_HOROVOD_SPIN", False, _bool,
     "Let the Horovod coordinator's waits spin while the caller computes (off: they sleep "
     "after one progress pass, and spin only while a caller waits for a result).")
knob("HOROVOD_TIMELINE", "", str,
     "Chrome-trace timeline of rank 0's Horovod operations, written to this path from init().")
knob("HOROVOD_TIMELINE_MARK_CYCLES", False, _bool, "Mark each coordinator cycle in the timeline.")
knob("HOROVOD_ELASTIC", False, _bool,
     "Set by commrt-launch --elastic: init() takes this worker's rank from the elastic "
     "driver's current generation.")
knob("HOROVOD_ELASTIC_TIMEOUT", 600.0, float,
     "Seconds an elastic worker waits in init() for the driver to form a generation with it.")
knob("COMMRT_LOG_LEVEL", "WARNING", str, "Logging level of the commrt logger.")
# -- the fault campaign (tests/faults; docs/reliability.md) -----------------
knob("COMMRT_FAULT_SEED", None, int,
     "Seed of every random choice of the fault campaign (world sizes, culprits, collective "
     "streams, fault points); unset: a fresh seed per run, printed in pytest's header.")
knob("COMMRT_FUZZ_CASES", 2000, int,
     "Cases per run of each parser fuzzer of the fault campaign (wire: split between TCP and "
     "shared memory; store). The default keeps CI's suite within its time budget; the "
     "campaign of docs/reliability.md sets 10^5.")
knob("COMMRT_SOAK_OPS", 4000, int,
     "Collectives the fault campaign's randomized soak runs and checks against NumPy (split "
     "between shared memory and TCP).  The default keeps CI's suite within its time budget; "
     "the campaign of docs/reliability.md sets 10^6.")

# -- the torch backend (commrt/torch; docs/torch.md) -------------------------
knob("COMMRT_TORCH_AUTOLOAD", True, _bool,
     "`import torch` registers the torch.distributed backend \"commrt\" (the `torch.backends` entry point); 0 turns that off (then `import commrt.torch` does it).")
knob("COMMRT_LONG_TESTS", False, _bool,
     "Tests: also run the tests marked `long` (a second transport, world size or launcher of a case the default suite already runs; the README's quick start), deselected by default to keep CI's suite within its 20 minutes.")
knob("COMMRT_TORCH_FULL", False, _bool,
     "Tests: tests/torch/test_torch_suite.py runs torch's whole generic distributed suite, not the CI subset.")
knob("COMMRT_TORCH_SUITE_BACKEND", "commrt", str,
     "Tests: the backend tests/torch/test_torch_suite.py runs torch's suite against (commrt or gloo).")
knob("COMMRT_TORCH_SUITE_START", "fork", str,
     "Tests: how tests/torch/test_torch_suite.py starts each test's ranks: fork (the CI subset's and the full run's default: ~0.5 s a test, the ranks inherit the imported suite), forkserver, or spawn (torch's own default, ~5 s a test: every rank imports the suite again).")
knob("COMMRT_TORCH_SUITE_WORLD", 2, int, "Tests: the world size of torch's suite in tests/torch/test_torch_suite.py.")
knob("COMMRT_TORCH_SUITE_GATES", "gloo", str,
     "Tests: the backend name torch's suite evaluates its backend gates (`BACKEND == \"gloo\"`) with when it runs on commrt: gloo (commrt runs every test gloo runs), mpi (the CPU all-to-all tests, which the suite runs for MPI only) or commrt (its own name: gloo-only tests skip).")


def get(name: str):
    """The value of knob ``name``: parsed from the environment, else its default."""
    k = KNOBS[name]
    raw = os.environ.get(name)
    if raw == "" and k.empty_is_value:
        return k.empty
    if raw is None or raw == "":
        return k.default
    try:
        return k.parse(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r}: {exc}") from None


# COMMRT_<COLLECTIVE>_ALGO is read on every call (tests and users set it at run
# time), straight from os.environ's own dict: os.environ.get costs ~0.8 us, a
# tenth of an 8-byte all-reduce.
_ENV = getattr(os.environ, "_data", None)
_ALGO_KEYS: Dict[str, list] = {}


def forced_algorithm(collective: str) -> str:
    """COMMRT_<COLLECTIVE>_ALGO for `collective` (all_reduce: also its alias
    COMMRT_ALLREDUCE_ALGO); "" when unset."""
    keys = _ALGO_KEYS.get(collective)
    if keys is None:
        names = [f"COMMRT_{collective.upper()}_ALGO"]
        if collective == "all_reduce":
            names.append("COMMRT_ALLREDUCE_ALGO")
        keys = _ALGO_KEYS[collective] = ([os.environ.encodekey(k) for k in names]
                                         if _ENV is not None else names)
    if _ENV is None:
        for k in keys:
            if os.environ.get(k):
                return os.environ[k]
        return ""
    for k in keys:
        raw = _ENV.get(k)
        if raw:
            return os.environ.decodevalue(raw)
    return ""


def describe() -> str:
    """A Markdown table of every knob (used for docs/configuration.md)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for k in KNOBS.values():
        rows.append(f"| `{k.name}` | `{k.default}` | {k.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":      # python -m commrt.config > docs/configuration.md
    print("# Configuration\n\nEvery knob is an environment variable, read when needed "
          "(so set it before `commrt.init()`).\n")
    print(describe())
