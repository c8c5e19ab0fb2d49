"""How the algorithms cut buffers: near-equal chunks, segments of
COMMRT_RING_SEGMENT_BYTES, and the blocks of packed variable-size buffers."""
from commrt import config


def bounds(n, parts):
    """Chunk boundaries splitting n elements into `parts` (the first n % parts one longer)."""
    q, r = divmod(n, parts)
    return [i * q + min(i, r) for i in range(parts + 1)]


def segments(lo, hi, seg):
    """[lo, hi) in pieces of at most seg elements; an empty range is one empty piece."""
    if hi <= lo:
        return [(lo, lo)]
    return [(s, min(s + seg, hi)) for s in range(lo, hi, seg)]


_SEG_BYTES = []


def seg_elems(itemsize):
    """Elements per segment of the pipelined algorithms (COMMRT_RING_SEGMENT_BYTES, read once)."""
    if not _SEG_BYTES:
        _SEG_BYTES.append(config.get("COMMRT_RING_SEGMENT_BYTES"))
    return max(1, _SEG_BYTES[0] // itemsize)


def offsets(counts):
    """Start of each block of a packed buffer holding blocks of `counts` elements,
    and the total at the end (the variable-size collectives)."""
    offs = [0] * (len(counts) + 1)
    for i, c in enumerate(counts):
        offs[i + 1] = offs[i] + c
    return offs
