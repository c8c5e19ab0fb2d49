"""python -m commrt.timeline: summarise, merge and draw commrt timelines.

    python -m commrt.timeline run.json                     # per-rank totals by category
    python -m commrt.timeline run.json --png run.png       # one row per rank, colour by category
    python -m commrt.timeline merge out.json a.json b.json # per-rank files -> one trace

A timeline is a Chrome-trace JSON file (Perfetto, chrome://tracing) written
by commrt.parallel.timeline: complete spans ("ph": "X") with pid = rank and
cat = compute | comm | wait | optimizer | data.  In the picture, waiting is
red: synchronous SGD's barrier waste and pipeline bubbles are the red (and
empty) parts of each row.
"""
import argparse
import json
import sys

from commrt.parallel.timeline import load_events, merge_events

COLOURS = {"compute": "#2c7bb6", "comm": "#fdae61", "wait": "#d7191c", "optimizer": "#1a9641",
           "data": "#984ea3"}
OTHER = "#999999"


def spans_by_rank(events):
    """{rank: [(start_s, dur_s, cat, name)]} of the complete spans, times from
    the earliest span.  Nested spans (a wait inside a backward) are kept."""
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        return {}
    t0 = min(e["ts"] for e in spans)
    out = {}
    for e in spans:
        out.setdefault(int(e["pid"]), []).append(
            ((e["ts"] - t0) / 1e6, e.get("dur", 0.0) / 1e6, e.get("cat", ""), e.get("name", "")))
    return dict(sorted(out.items()))


def summary(events):
    """Seconds per rank and category (outermost spans only for the total),
    as text lines."""
    by_rank = spans_by_rank(events)
    cats = sorted({c for spans in by_rank.values() for _, _, c, _ in spans})
    lines = ["rank  " + "  ".join(f"{c:>10}" for c in cats) + "       span"]
    for rank, spans in by_rank.items():
        total = {c: 0.0 for c in cats}
        for _, d, c, _ in spans:
            total[c] += d
        first = min(s for s, _, _, _ in spans)
        last = max(s + d for s, d, _, _ in spans)
        lines.append(f"{rank:>4}  " + "  ".join(f"{total[c]:10.4f}" for c in cats)
                     + f"  {last - first:9.4f} s")
    return lines


def draw(events, png, title=None, start=None, end=None):
    """One row per rank; a span is a bar coloured by category; spans nested
    in others (a wait inside a backward) are drawn thinner, on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    by_rank = spans_by_rank(events)
    if not by_rank:
        raise ValueError("the timeline has no spans")
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(by_rank) + 1.4))
    seen = set()
    for row, (rank, spans) in enumerate(by_rank.items()):
        spans = sorted(spans, key=lambda s: (s[0], -s[1]))
        stack = []                       # ends of enclosing spans, for nesting depth
        for s, d, cat, _ in spans:
            if (start is not None and s + d < start) or (end is not None and s > end):
                continue
            while stack and stack[-1] <= s:
                stack.pop()
            depth = len(stack)
            stack.append(s + d)
            height = 0.8 * (0.6 ** depth)
            ax.broken_barh([(s, max(d, 1e-7))], (row - height / 2, height),
                           facecolors=COLOURS.get(cat, OTHER), linewidth=0)
            seen.add(cat)
    ax.set_yticks(range(len(by_rank)))
    ax.set_yticklabels([f"rank {r}" for r in by_rank])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    if start is not None or end is not None:
        ax.set_xlim(left=start, right=end)
    ax.set_title(title or "commrt timeline")
    ax.legend(handles=[Patch(color=COLOURS.get(c, OTHER), label=c) for c in sorted(seen)],
              loc="upper right", ncol=len(seen), fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def merge(out, paths):
    """Merge per-rank trace files into one."""
    with open(out, "w") as f:
        json.dump({"traceEvents": merge_events(paths), "displayTimeUnit": "ms"}, f)
    return out


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["merge"]:
        p = argparse.ArgumentParser(prog="python -m commrt.timeline merge")
        p.add_argument("out")
        p.add_argument("inputs", nargs="+")
        a = p.parse_args(argv[1:])
        merge(a.out, a.inputs)
        return 0
    p = argparse.ArgumentParser(prog="python -m commrt.timeline",
                                description=__doc__.splitlines()[0])
    p.add_argument("trace", nargs="+", help="Chrome-trace file(s); several are merged")
    p.add_argument("--png", help="draw the timeline into this PNG file")
    p.add_argument("--title")
    p.add_argument("--start", type=float, help="first second to draw")
    p.add_argument("--end", type=float, help="last second to draw")
    a = p.parse_args(argv)
    events = merge_events(a.trace) if len(a.trace) > 1 else load_events(a.trace[0])
    for line in summary(events):
        print(line)
    if a.png:
        draw(events, a.png, a.title, a.start, a.end)
        print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
