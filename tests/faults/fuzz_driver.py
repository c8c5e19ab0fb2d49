"""The parent side of the wire fuzzers: keeps a fuzz_target child alive and asks it cases.

A case that kills the child (a crash) or gets no verdict within the deadline
(a hang) raises CaseFailed; the next case starts a fresh child, so
hypothesis can shrink a crashing input to its smallest form.
"""
import multiprocessing as mp
import os
import signal
import time

import fuzz_target

CASE_DEADLINE_S = 60.0
SLOTS = 400          # cases per child (each takes a fresh peer of the engine)


class CaseFailed(AssertionError):
    pass


class Driver:
    def __init__(self, kind, log_path):
        self.kind, self.log_path = kind, log_path
        self.proc = self.conn = None
        self.cases = 0
        self.children = 0

    def _start(self):
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        with open(self.log_path, "ab") as log:    # the child's stderr (engine warnings) goes here
            saved = os.dup(2)
            os.dup2(log.fileno(), 2)
            try:
                self.proc = ctx.Process(target=fuzz_target.serve, args=(child, self.kind, SLOTS),
                                        daemon=True)
                self.proc.start()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
        child.close()
        self.conn = parent
        self.children += 1
        kind, value = self._answer(60.0, "start")
        if kind != "ready":
            raise RuntimeError(f"the fuzz target did not start: {value}")

    def _answer(self, timeout, what):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.conn.poll(0.05):
                try:
                    return self.conn.recv()
                except EOFError:
                    break
            if not self.proc.is_alive():
                break
        self.proc.join(1.0)
        code = self.proc.exitcode
        self.stop()
        if code is None:
            raise CaseFailed(f"the engine gave no verdict within {timeout:g} s on {what} (hang)")
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        raise CaseFailed(f"the engine process died ({how}) on {what}")

    def run(self, case):
        """The child's verdict on one case (a dict); CaseFailed on a crash or hang."""
        if self.proc is None:
            self._start()
        self.conn.send(case)
        kind, value = self._answer(CASE_DEADLINE_S, "this case")
        if kind == "error":
            self.stop()
            raise RuntimeError(f"the fuzz harness broke: {value}")
        if value.get("exhausted"):
            self.stop()
            return self.run(case)
        self.cases += 1
        return value

    def stop(self):
        if self.proc is not None:
            try:
                self.conn.send(None)
            except (OSError, ValueError):
                pass
            self.proc.join(5.0)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5.0)
            self.conn.close()
        self.proc = self.conn = None
