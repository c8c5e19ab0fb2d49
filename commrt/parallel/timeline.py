"""Timeline: what each rank did when, as a Chrome trace (Perfetto, chrome://tracing).

    from commrt.parallel import timeline
    with timeline.span("forward 3", "compute"):
        y = stage(x)
    timeline.record("all-reduce wait", "wait", t0_ns, t1_ns)   # a span measured elsewhere

Enabled by ``COMMRT_TIMELINE=path`` (``{rank}`` in the path becomes the
rank) or by ``commrt-launch --timeline run.json``, which gives every rank
its own file and merges them into one trace at the end (pid = rank).  Spans
are kept in memory and written when the process exits (or on ``save()``).

Categories (the colours of ``python -m commrt.timeline run.json --png``):
``compute`` (forward, backward), ``comm`` (posting or moving data: a
send, a collective that moves bytes), ``wait`` (blocked on a peer: a
receive, an all-reduce wait, a barrier), ``optimizer`` (the update),
``data`` (loading a batch); any other string is allowed.

Cost: when disabled, ``span()`` returns one shared no-op context manager
after a single global check (tens of nanoseconds); ``enabled()`` lets a
caller skip building span names.  When enabled, a span is two clock reads
and one list append.  The clock is CLOCK_MONOTONIC (shared by the processes
of one host) shifted to the wall clock once per process, so ranks on one
host line up to the microsecond.

This module imports nothing heavy (no NumPy): the launcher's merge uses
only ``json``.
"""
import atexit
import json
import os
import threading
import time

__all__ = ["Timeline", "span", "record", "instant", "enabled", "start", "stop", "save",
           "now_ns", "get", "load_events", "merge_events"]

CATEGORIES = ("compute", "comm", "wait", "optimizer", "data")

now_ns = time.monotonic_ns


class Timeline:
    """Spans of one process, written as a Chrome-trace JSON object."""

    def __init__(self, path, rank=0, name=None):
        self.path = path
        self.rank = int(rank)
        self.name = name or f"rank {self.rank}"
        self.events = []
        self._offset_us = (time.time_ns() - time.monotonic_ns()) / 1000.0
        self._threads = {}
        self._lock = threading.Lock()

    def _tid(self):
        ident = threading.get_ident()
        tid = self._threads.get(ident)
        if tid is None:
            with self._lock:
                tid = self._threads.setdefault(ident, len(self._threads))
        return tid

    def add(self, name, cat, start_ns, end_ns, args=None):
        """One complete span ("ph": "X") from start_ns to end_ns (monotonic ns)."""
        ev = {"name": name, "cat": cat, "ph": "X", "pid": self.rank, "tid": self._tid(),
              "ts": start_ns / 1000.0 + self._offset_us,
              "dur": max(0.0, (end_ns - start_ns) / 1000.0)}
        if args:
            ev["args"] = args
        self.events.append(ev)

    def add_instant(self, name, cat, args=None):
        ev = {"name": name, "cat": cat, "ph": "i", "s": "t", "pid": self.rank,
              "tid": self._tid(), "ts": now_ns() / 1000.0 + self._offset_us}
        if args:
            ev["args"] = args
        self.events.append(ev)

    def trace(self):
        meta = [{"name": "process_name", "ph": "M", "pid": self.rank, "tid": 0,
                 "args": {"name": self.name}},
                {"name": "process_sort_index", "ph": "M", "pid": self.rank, "tid": 0,
                 "args": {"sort_index": self.rank}}]
        for ident, tid in self._threads.items():
            label = "main" if ident == threading.main_thread().ident else f"thread {tid}"
            meta.append({"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid,
                         "args": {"name": label}})
        return {"traceEvents": meta + list(self.events), "displayTimeUnit": "ms"}

    def save(self, path=None):
        path = path or self.path
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.trace(), f)
        os.replace(tmp, path)
        return path


# ---- the process-wide timeline -------------------------------------------------------
_active = None          # the Timeline, or None when disabled
_checked = False        # COMMRT_TIMELINE read?


class _NullSpan:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL = _NullSpan()


class _Span:
    __slots__ = ("tl", "name", "cat", "args", "t0")

    def __init__(self, tl, name, cat, args):
        self.tl, self.name, self.cat, self.args = tl, name, cat, args

    def __enter__(self):
        self.t0 = now_ns()
        return self

    def __exit__(self, *exc):
        self.tl.add(self.name, self.cat, self.t0, now_ns(), self.args)
        return False


def _from_env():
    global _checked
    _checked = True
    from commrt import config

    path = config.get("COMMRT_TIMELINE")
    if path:
        rank = int(os.environ.get("COMMRT_RANK") or 0)
        start(path.replace("{rank}", str(rank)), rank)


def get():
    """The active Timeline, or None (reads COMMRT_TIMELINE the first time)."""
    if not _checked:
        _from_env()
    return _active


def enabled():
    """True when spans are being recorded."""
    return (_active if _checked else get()) is not None


def span(name, cat="compute", **args):
    """Context manager recording one span; a shared no-op when disabled."""
    tl = _active if _checked else get()
    if tl is None:
        return _NULL
    return _Span(tl, name, cat, args or None)


def record(name, cat, start_ns, end_ns, **args):
    """Record a span measured by the caller with ``now_ns()`` (e.g. from the
    moment an asynchronous all-reduce was started to the end of its wait)."""
    tl = _active if _checked else get()
    if tl is not None:
        tl.add(name, cat, start_ns, end_ns, args or None)


def instant(name, cat="mark", **args):
    """A zero-length marker (e.g. 'epoch 3')."""
    tl = _active if _checked else get()
    if tl is not None:
        tl.add_instant(name, cat, args or None)


def start(path, rank=0, name=None):
    """Start recording to ``path`` (written at exit or on save()); returns the Timeline."""
    global _active, _checked
    if _active is not None and _active.path != path:
        _active.save()
    _active = Timeline(path, rank, name)
    _checked = True
    return _active


def stop(save_file=True):
    """Stop recording; write the file unless save_file is False.  Returns its path or None."""
    global _active
    tl, _active = _active, None
    if tl is not None and save_file:
        return tl.save()
    return None


def save():
    """Write the active timeline now (it is also written at exit)."""
    return _active.save() if _active is not None else None


@atexit.register
def _save_at_exit():
    if _active is not None:
        try:
            _active.save()
        except OSError:
            pass


# ---- reading and merging traces -----------------------------------------------------
def load_events(path):
    """The traceEvents of a Chrome-trace file (object or bare-array form)."""
    with open(path) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def merge_events(paths):
    """One event list from several per-rank traces, timestamps shifted so the
    earliest span starts at 0."""
    events = []
    for p in paths:
        events.extend(load_events(p))
    stamps = [e["ts"] for e in events if "ts" in e and e.get("ph") != "M"]
    t0 = min(stamps) if stamps else 0.0
    for e in events:
        if "ts" in e and e.get("ph") != "M":
            e["ts"] = e["ts"] - t0
    return events
