"""NCCL's published all-reduce cost model (ring against tree), re-expressed for comparison.

Source: NVIDIA/nccl src/graph/tuning.cc (``ncclTopoTuneModel`` and
``ncclTopoGetAlgoTime``, the version at commit 01afd20a77b5 in the search
index: Tree, Ring and CollNet; LL, LL128 and Simple).  Its terms, for an
all-reduce of K bytes over N ranks on H nodes (P = N/H per node):

* time = latency + K / (1000 · algorithm bandwidth) µs, bandwidth in GB/s;
* ring latency = base + (2(N−1) − 2(H−1))·intra + 2(H−1)·inter, the
  per-hop latencies of the link kind (NVLink or PCI inside a node, the
  network between; LL's intra ×1.8 on several nodes), and ×1.9 for Simple
  on several nodes once K ≥ N/16·64 KiB (its "plateau");
* tree latency = base + 2·((P−1)·intra + ⌊log₂H⌋·inter);
* ring bandwidth = bus bandwidth · N/(2(N−1)) (LL: ·1/4, LL128: ·0.92,
  ·0.7 at one rank per node); tree = min(0.9·bus, 80 GB/s on more than two
  nodes, else 110) · 1/2 (LL: ·1/3.8, LL128: ·0.915), times a correction
  for mid sizes (a table by log₂(K/64)).

So the ring's latency grows with N and the tree's with log H: NCCL's tree
wins small and mid sizes on many nodes, the ring large ones.  Only the
constants' structure is used here; bus bandwidth (channels × per-channel
speed) is the caller's.
"""

PROTOCOLS = ("LL", "LL128", "Simple")
BASE_LAT = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}       # µs
HW_LAT = {   # per hop, µs: [link][algorithm][protocol]
    "nvlink": {"tree": (0.52, 1.2, 28.0), "ring": (0.47, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 50.0), "ring": (2.7, 4.0, 9.6)},
}
LL128_MAX_BW_PER_CHANNEL = 16.7   # GB/s, all-reduce
TREE_CORRECTION = {   # by log2(K / 64), 64 B .. 128 MiB
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9,
           1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8,
              .9, .9, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .5, .5, .6, .6, .7,
               .8, .9),
}


def _log2i(x):
    return int(x).bit_length() - 1 if x >= 1 else -1


def latency_us(algo, proto, ranks, nodes, intra="nvlink"):
    p = PROTOCOLS.index(proto)
    intra_lat = HW_LAT[intra][algo][p]
    inter_lat = HW_LAT["net"][algo][p]
    if nodes > 1 and proto == "LL":
        intra_lat *= 1.8
    lat = BASE_LAT[algo][p]
    if algo == "ring":
        inter = 2 * (nodes - 1)
        return lat + (2 * (ranks - 1) - inter) * intra_lat + inter * inter_lat
    return lat + 2 * ((ranks // nodes - 1) * intra_lat + _log2i(nodes) * inter_lat)


def bandwidth_gbps(algo, proto, ranks, nodes, bus):
    """Algorithm bandwidth (GB/s) for a bus bandwidth of ``bus`` GB/s (channels × speed)."""
    ppn = ranks / nodes
    if algo == "ring":
        if proto == "LL":
            bus /= 4
        elif proto == "LL128":
            bus = bus * (0.7 if ppn < 2 else 0.92)
        return bus * ranks / (2 * (ranks - 1))
    bus = min(bus * 0.9, 80.0 if nodes > 2 else 110.0)
    if proto == "LL":
        bus /= 3.8
    elif proto == "LL128":
        bus *= 7 / 9 if nodes == 1 else 0.915
    return bus * 0.5


def time_us(algo, proto, ranks, nodes, nbytes, bus, intra="nvlink"):
    """NCCL's predicted µs for one all-reduce of nbytes."""
    bw = bandwidth_gbps(algo, proto, ranks, nodes, bus)
    lat = latency_us(algo, proto, ranks, nodes, intra)
    log_size = _log2i(nbytes >> 6)
    if algo == "tree" and 0 <= log_size < 22:
        bw *= TREE_CORRECTION[proto][log_size]
    if (algo == "ring" and proto == "Simple" and nodes > 1
            and nbytes >= ranks / 16.0 * 65536):
        lat *= 1.9
    return lat + nbytes / (1000 * bw)


def best(algo, ranks, nodes, nbytes, bus, protocols=PROTOCOLS, intra="nvlink"):
    """(µs, protocol) of an algorithm's fastest protocol, as NCCL's tuner takes it."""
    return min((time_us(algo, p, ranks, nodes, nbytes, bus, intra), p) for p in protocols)


def crossover(ranks, nodes, bus, sizes, protocols=PROTOCOLS, intra="nvlink"):
    """The smallest of ``sizes`` from which NCCL's ring beats its tree at every larger
    size (None if the tree wins the largest; sizes[0] if the ring wins all)."""
    ring_wins = [best("ring", ranks, nodes, k, bus, protocols, intra)[0]
                 < best("tree", ranks, nodes, k, bus, protocols, intra)[0] for k in sizes]
    return first_of_last_run(sizes, ring_wins)


def first_of_last_run(sizes, wins):
    """The first size of the final run of True in wins (None if the last is False)."""
    if not wins or not wins[-1]:
        return None
    i = len(wins) - 1
    while i > 0 and wins[i - 1]:
        i -= 1
    return sizes[i]

