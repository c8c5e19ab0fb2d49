"""Summaries and text tables for the benchmarks: medians with their spread.

The machines we measure on swing between fast and slow states for seconds
to minutes, so every number a benchmark prints is the median over rounds,
quoted with the minimum and maximum it was drawn from.
"""
import statistics

_UNITS = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def parse_size(text):
    """'8', '64K', '4MiB', '1m' -> bytes (powers of 1024)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    value = int(float(t[:-1] if scale > 1 else t) * scale)
    if value < 0:
        raise ValueError(f"negative size {text!r}")
    return value


def fmt_size(n):
    """8 -> '8 B', 65536 -> '64 KiB'."""
    for scale, unit in _UNITS:
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def fmt_num(x):
    """About three significant digits, without exponent for the usual ranges."""
    if x is None:
        return "n/a"
    a = abs(x)
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    if a >= 0.01:
        return f"{x:.3f}"
    return f"{x:.2g}"


class Summary:
    """Median, minimum and maximum of a list of samples (None if empty)."""

    __slots__ = ("median", "min", "max", "n")

    def __init__(self, samples):
        samples = [s for s in samples if s is not None]
        self.n = len(samples)
        self.median = statistics.median(samples) if samples else None
        self.min = min(samples) if samples else None
        self.max = max(samples) if samples else None

    def cell(self):
        if self.median is None:
            return "n/a"
        if self.n == 1:
            return fmt_num(self.median)
        return f"{fmt_num(self.median)} [{fmt_num(self.min)}-{fmt_num(self.max)}]"

    def as_dict(self):
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n}


def ratio(a, b):
    """a / b as text, or 'n/a'."""
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}"


def table(headers, rows, aligns=None):
    """A plain text table; aligns is a string of 'l'/'r' per column."""
    cols = len(headers)
    aligns = aligns or "l" + "r" * (cols - 1)
    widths = [max(len(str(r[i])) for r in [headers] + rows) for i in range(cols)]

    def line(cells):
        out = []
        for i, c in enumerate(cells):
            c = str(c)
            out.append(c.ljust(widths[i]) if aligns[i] == "l" else c.rjust(widths[i]))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep] + [line(r) for r in rows])
