"""Horovod's timeline: a Chrome trace of each named tensor's life on this rank.

As in Horovod, every tensor name is a row (a trace "process" named after
the tensor); its spans are the phases Horovod names: NEGOTIATE_<OP> from
submission until every rank is ready, then <OP> (ALLREDUCE, ALLGATHER, ...)
with nested activities (MEMCPY_IN_FUSION_BUFFER, GLOO_ALLREDUCE,
MEMCPY_OUT_FUSION_BUFFER).  Open the file in Perfetto or chrome://tracing.
"""
import json
import os
import threading
import time


class Timeline:
    def __init__(self, path, mark_cycles=False):
        self.path = path
        self.mark_cycles = mark_cycles
        self._lock = threading.Lock()
        self._events = []
        self._rows = {}                     # tensor name -> pid
        self._open = {}                     # tensor name -> open span names, outermost first
        self._t0 = time.monotonic()
        self._events.append({"name": "horovod", "ph": "M", "pid": 0, "args": {
            "start_time_since_epoch_in_micros": int(time.time() * 1e6)}})

    def _ts(self):
        return (time.monotonic() - self._t0) * 1e6

    def _row(self, name):
        pid = self._rows.get(name)
        if pid is None:
            pid = self._rows[name] = len(self._rows) + 1
            self._events.append({"name": "process_name", "ph": "M", "pid": pid,
                                 "args": {"name": name}})
            self._events.append({"name": "process_sort_index", "ph": "M", "pid": pid,
                                 "args": {"sort_index": pid}})
        return pid

    def start(self, name, phase):
        """Open the top-level span `phase` of tensor `name`."""
        with self._lock:
            self._close(name)
            self._events.append({"name": phase, "ph": "B", "ts": self._ts(),
                                 "pid": self._row(name), "tid": 0})
            self._open[name] = [phase]

    def activity(self, name, activity):
        """A nested activity of the open span of `name` (the previous one ends)."""
        with self._lock:
            stack = self._open.get(name)
            if not stack:
                return
            pid, ts = self._row(name), self._ts()
            if len(stack) > 1:
                self._events.append({"ph": "E", "ts": ts, "pid": pid, "tid": 0})
                stack.pop()
            self._events.append({"name": activity, "ph": "B", "ts": ts, "pid": pid, "tid": 0})
            stack.append(activity)

    def end(self, name):
        with self._lock:
            self._close(name)

    def cycle(self):
        if self.mark_cycles:
            with self._lock:
                self._events.append({"name": "CYCLE_START", "ph": "i", "s": "g",
                                     "ts": self._ts(), "pid": 0, "tid": 0})

    def _close(self, name):
        stack = self._open.pop(name, None)
        if stack:
            pid, ts = self._row(name), self._ts()
            for _ in stack:
                self._events.append({"ph": "E", "ts": ts, "pid": pid, "tid": 0})

    def close(self):
        """Close every open span and write the trace."""
        with self._lock:
            for name in list(self._open):
                self._close(name)
            events = list(self._events)
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(events, f)
        os.replace(tmp, self.path)
