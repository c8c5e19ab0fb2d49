"""``run_tasks``: a nogil kernel's tasks on Python threads (the Winograd
convolution's chunks), every task once, errors raised in the caller, and a
forked child with a pool of its own."""
import os
import threading
import time

import numpy as np
import pytest

from commrt.kernels import _jit
from commrt.kernels._jit import njit, run_tasks


@njit(nogil=True, cache=True)
def _square(out, i):
    out[i] = i * i


def _threads(monkeypatch, n):
    monkeypatch.setattr(_jit.numba, "get_num_threads", lambda: n)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_task_runs_once(monkeypatch, threads):
    _threads(monkeypatch, threads)
    out = np.full(7, -1.0)
    run_tasks(_square, 7, out)
    assert out.tolist() == [i * i for i in range(7)]
    run_tasks(_square, 0, out)          # no tasks: nothing runs, nothing waits


def test_tasks_run_at_once_on_several_threads(monkeypatch):
    # each task waits for the other: only two threads at once can finish them
    _threads(monkeypatch, 2)
    meet = threading.Barrier(2, timeout=10)
    run_tasks(lambda i: meet.wait(), 2)


def test_a_failing_task_raises_in_the_caller(monkeypatch):
    _threads(monkeypatch, 2)

    def task(i):
        if i == 3:
            raise ValueError("task 3 failed")
    with pytest.raises(ValueError, match="task 3 failed"):
        run_tasks(task, 5)
    out = np.zeros(4)                   # the pool still serves the next call
    run_tasks(_square, 4, out)
    assert out.tolist() == [0, 1, 4, 9]


def test_a_forked_child_runs_tasks_on_a_pool_of_its_own(monkeypatch):
    _threads(monkeypatch, 2)
    run_tasks(_square, 4, np.zeros(4))      # the parent's pool exists now
    pid = os.fork()
    if pid == 0:                            # the child: its parent's threads are not here
        code = 2
        try:
            out = np.zeros(4)
            run_tasks(_square, 4, out)
            code = 0 if out.tolist() == [0, 1, 4, 9] else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's tasks never ran (it waited on its parent's pool)")
