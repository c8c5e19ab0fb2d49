"""The fingerprint of a collective call, carried in every message's two 64-bit
header words (meta, meta2; layout at pack): sequence, kind, algorithm, op,
dtype, root, count.  Kinds are "none", the registry's collectives and the
internal kinds; algorithm codes come from the registry
(collectives/registry.py), which checks they fit.
"""
from commrt import _lazy

TAG = 7           # collective traffic on the channel's context
PROBE_TAG = 8     # mismatch probes
# lanes of one call: tags of their own on the channel's context, so that two
# streams of one call between the same pair never match each other's
# receives (dbtree's two trees); fingerprinted and checked as TAG's
LANE_TAGS = (9, 10)


# Internal call kinds beside the registry's collectives (registry.BORROWS says
# whose algorithm codes they carry).
INTERNAL_KINDS = ("broadcast_obj", "all_gather_obj", "gather_obj", "split", "new_group",
                  "calibrate")
_KINDS = []
KIND_BITS = 6


def kinds():
    """Every call kind, by wire code: "none", the registry's collectives, the
    internal kinds (built once; the same on every rank of one installation)."""
    if not _KINDS:
        from commrt.collectives import registry

        names = ("none",) + registry.collectives() + INTERNAL_KINDS
        if len(names) > 1 << KIND_BITS:
            raise ImportError(f"{len(names)} call kinds do not fit the fingerprint's "
                              f"{KIND_BITS}-bit kind field")
        _KINDS.extend(names)
        KIND_CODE.update({k: i for i, k in enumerate(names)})
    return _KINDS


KIND_CODE = {}


def kind_code(kind):
    return KIND_CODE.get(kind) or kinds().index(kind)


def algo_code(kind, algo):
    from commrt.collectives import registry

    return registry.code(kind, algo)


# The dtype table is filled once NumPy is loaded (a barrier and init() need no
# NumPy; a call with an array has loaded it before it looks a dtype up here).
DTYPES = []
DTYPE_CODE = {}


def _dtypes(np):
    from commrt.kernels.bfloat16 import BFLOAT16

    DTYPES[:] = [np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64,
                                       np.uint8, np.uint16, np.uint32, np.uint64, np.float16,
                                       np.float32, np.float64, np.complex64,
                                       np.complex128)] + [BFLOAT16]
    DTYPE_CODE.update({d: i + 1 for i, d in enumerate(DTYPES)})


_lazy.when_loaded("numpy", _dtypes)

OP_NAMES = ("-", "SUM", "PROD", "MIN", "MAX", "AVG", "LAND", "LOR", "BAND", "BOR", "BXOR")


# -- fingerprints ------------------------------------------------------------------
# Two 64-bit header words (wire version 2, docs/transport.md): meta holds the
# sequence number (40 bits), kind, algorithm (6 bits each), op (4), dtype (6);
# meta2 the root (24 bits) and the element count (40).  Every field is whole
# for any real job (10^12 calls, 16 M ranks, 10^12 elements).
SEQ_MASK = (1 << 40) - 1


def pack(seq, kind, algo, count, dtype, op, root):
    """(meta, meta2) of a call's fingerprint."""
    return ((seq & SEQ_MASK) | (kind & 0x3F) << 40 | (algo & 0x3F) << 46 | (op & 0xF) << 52
            | (dtype & 0x3F) << 56,
            (root & 0xFFFFFF) | (count & ((1 << 40) - 1)) << 24)


def unpack(meta, meta2=0):
    return {"seq": meta & SEQ_MASK, "kind": meta >> 40 & 0x3F, "algo": meta >> 46 & 0x3F,
            "op": meta >> 52 & 0xF, "dtype": meta >> 56 & 0x3F, "root": meta2 & 0xFFFFFF,
            "count": meta2 >> 24}


def describe_meta(meta, meta2=0, serving=None):
    """Text for a packed fingerprint; serving: the user's collective (its kind) the
    call ran inside, where known (this rank's own calls)."""
    f = unpack(meta, meta2)
    names = kinds()
    kind = names[f["kind"]] if f["kind"] < len(names) else f"kind{f['kind']}"
    dt = DTYPES[f["dtype"] - 1].name if 0 < f["dtype"] <= len(DTYPES) else "-"
    parts = [f"count={f['count']}", f"dtype={dt}"]
    if f["op"]:
        parts.append(f"op={OP_NAMES[f['op']] if f['op'] < len(OP_NAMES) else f['op']}")
    parts.append(f"root={f['root']}")
    if f["algo"]:
        from commrt.collectives import registry

        parts.append(f"algo={registry.name_of(kind, f['algo'])}")
    if serving is not None:
        return f"{serving} #{f['seq']} (its {kind}: {', '.join(parts)})"
    return f"#{f['seq']} {kind}({', '.join(parts)})"


def diff(mine, theirs):
    """The fields that differ between two fingerprints, each (meta, meta2)."""
    a, b = unpack(*mine), unpack(*theirs)
    return [k for k in ("seq", "kind", "algo", "count", "dtype", "op", "root") if a[k] != b[k]]
