"""The one list of algorithms, discovered from the package.

Every collective is a subpackage, ``collectives/<collective>/``, and every
algorithm of it one module, ``<collective>/<algorithm>.py`` (modules whose
name starts with ``_`` are helpers, not algorithms).  An algorithm module
exports, by convention:

    run(call, ...)            the algorithm, speaking only to ``call`` (the
                              Call interface, collectives/call.py); its
                              arguments are the collective's (see RUN_ARGS)
    cost(n, nbytes, p, comm=None)
                              α-β-γ seconds for n ranks and nbytes (the
                              collective's reference size: the buffer, the
                              output of gathers, the input of reduce-scatter)
    eligible(comm)            optional: whether it applies to comm (default yes)
    schedule(n, rank, count, root=0)
                              optional: the messages of each step, a list of
                              steps, each a list of Msg (see below)
    TIE                       optional int: among equal predictions the
                              lowest TIE wins (default 100, then the name)

and a block comment (its docstring) giving its steps, its cost and its
bytes on the wire.  This registry feeds the wire code of each algorithm
(``code``: its position among its collective's algorithms, checked against
the fingerprint field's width), the cost model's choice and tie-break
(cost.choose), ``COMMRT_<COLLECTIVE>_ALGO`` (config.forced_algorithm), the
table in docs/algorithms.md (``describe``) and the tests' algorithm lists
(``commrt.collectives.ALGORITHMS``).  Adding an algorithm is one file.

The package imports every algorithm package before it defines its public
functions (commrt.collectives.broadcast is the function; its algorithms
are the package commrt.collectives.broadcast in sys.modules): import an
algorithm with ``from commrt.collectives.<collective> import <algorithm>``
or ``registry.module``, never as ``import commrt.collectives.<c>.<a>``.

A schedule's Msg is (op, peer, lo, hi): op "send", "recv" or "combine"
(receive and combine into the elements [lo, hi) of the collective's
result buffer), peer a rank; every message of a step is posted together.
Messages on a lane of the call (an int ctx: the tag they travel on,
fingerprint.LANE_TAGS; dbtree's two trees) carry it in ``ctx``
(``on_context``): they match only messages of the same ctx, as on the
wire; a plain Msg has ctx None.  (The simulator also separates any other
ctx value the same way.)
A combine the sender copies (``sender_copies``) has ``copier`` "sender".
Schedules of algorithms that cut messages into segments take ``itemsize``
(bytes per element, default 4) as the runtime's ``seg_elems`` does.
"""
import importlib
import pkgutil
from collections import namedtuple

Msg = namedtuple("Msg", "op peer lo hi")
Msg.ctx = None
Msg.copier = None


class _Tagged(Msg):
    """A Msg with a context (``ctx``) or a copier of its own."""


def _tagged(m, op, peer, lo, hi, ctx=None, copier=None):
    t = _Tagged(op, peer, lo, hi)
    t.ctx = m.ctx if ctx is None else ctx
    t.copier = m.copier if copier is None else copier
    return t


def on_context(ctx, steps):
    """steps with every message on lane ctx (its peers unchanged)."""
    return [[_tagged(m, *m, ctx=ctx) for m in step] for step in steps]


def sender_copies(steps):
    """steps with every combine marked ``copier = "sender"``: over shared memory
    the sender's core streams it through the pair's ring while the receiver's
    combines it as it lands (Channel.SENDER; the binomial reduce's), where a
    plain receive's receiver copies, then combines (commrt/sim/engine.py)."""
    return [[_tagged(m, *m, copier="sender") if m.op == "combine" else m for m in step]
            for step in steps]


def relabel(steps, ranks):
    """steps of a group of ranks with each peer q replaced by ranks[q] (its rank
    here), lanes and copiers kept."""
    return [[_tagged(m, m.op, ranks[m.peer], m.lo, m.hi) for m in step] for step in steps]

# the fingerprint's algorithm field (collectives/fingerprint.py)
CODE_BITS = 6

# The collective each internal call kind borrows its algorithms from (their
# fingerprints carry that collective's algorithm codes).
BORROWS = {"calibrate": "broadcast", "broadcast_obj": "broadcast",
           "all_gather_obj": "all_gather", "gather_obj": "gather", "split": "all_gather",
           "new_group": "all_gather"}

_TABLE = {}          # collective -> {name: module}, in choice order


def _build():
    import commrt.collectives as pkg

    table = {}
    for sub in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if not sub.ispkg or sub.name.startswith("_"):
            continue
        package = importlib.import_module(f"{pkg.__name__}.{sub.name}")
        mods = {}
        for m in pkgutil.iter_modules(package.__path__):
            if m.name.startswith("_") or m.ispkg:
                continue
            mod = importlib.import_module(f"{package.__name__}.{m.name}")
            missing = [a for a in ("run", "cost") if not hasattr(mod, a)]
            if missing:
                raise ImportError(f"algorithm {sub.name}/{m.name}.py lacks {', '.join(missing)} "
                                  f"(see collectives/registry.py)")
            mods[m.name] = mod
        if not mods:
            continue
        if len(mods) >= 1 << CODE_BITS:
            raise ImportError(f"{sub.name} has {len(mods)} algorithms: the fingerprint's "
                              f"{CODE_BITS}-bit algorithm field holds {(1 << CODE_BITS) - 1}")
        table[sub.name] = dict(sorted(mods.items(),
                                      key=lambda kv: (getattr(kv[1], "TIE", 100), kv[0])))
    _TABLE.update(table)


def table():
    """{collective: {algorithm: module}} (built on first use)."""
    if not _TABLE:
        _build()
    return _TABLE


def collectives():
    return tuple(table())


def names(collective):
    """The algorithms of a collective, in tie-break order."""
    return tuple(table()[collective])


def module(collective, name):
    mods = table().get(collective)
    if mods is None:
        raise ValueError(f"no collective {collective!r}; expected one of "
                         f"{', '.join(table())}")
    mod = mods.get(name)
    if mod is None:
        raise ValueError(f"unknown {collective.replace('_', '-')} algorithm {name!r}; expected "
                         f"one of {', '.join(mods)}")
    return mod


_CODES = {}


def code(kind, name):
    """The wire code of algorithm `name` in a call of `kind`: 1 + its position among
    its collective's algorithms sorted by name (0: none)."""
    key = (kind, name)
    c = _CODES.get(key)
    if c is None:
        if name in (None, "-"):
            c = 0
        else:
            coll = BORROWS.get(kind, kind)
            c = 1 + sorted(table()[coll]).index(module(coll, name).__name__.rsplit(".", 1)[1])
        _CODES[key] = c
    return c


def name_of(kind, c):
    """The algorithm name of wire code c in a call of kind (for error messages)."""
    if not c:
        return None
    coll = BORROWS.get(kind, kind)
    ordered = sorted(table().get(coll, ()))
    return ordered[c - 1] if 0 < c <= len(ordered) else f"algo{c}"


def eligible(collective, name, comm):
    check = getattr(module(collective, name), "eligible", None)
    return True if check is None else bool(check(comm))


def describe():
    """The Markdown table of every collective's algorithms (docs/algorithms.md)."""
    rows = ["| collective | algorithms (tie-break order) | forced by |", "|---|---|---|"]
    for coll, mods in table().items():
        algos = ", ".join(f"`{a}`" + ("" if hasattr(m, "schedule") else "*")
                          for a, m in mods.items())
        var = f"`COMMRT_{coll.upper()}_ALGO`"
        if coll == "all_reduce":
            var += " (alias `COMMRT_ALLREDUCE_ALGO`)"
        rows.append(f"| {coll} | {algos} | {var} |")
    return "\n".join(rows)
