"""The one place kernels import Numba from.

Numba's OpenMP threading layer kills a process that forks after using it,
and ranks may be started by fork (multiprocessing, some launchers): pick the
fork-safe ``workqueue`` layer unless the user chose one.
"""
import os
import threading

import numba

if not os.environ.get("NUMBA_THREADING_LAYER"):
    numba.config.THREADING_LAYER = "workqueue"

from numba import njit, prange  # noqa: E402,F401


_pool = [None, 0]        # executor, its threads
_pool_lock = threading.Lock()


def _after_fork_in_child():
    # the parent's pool threads are not in the child, and a thread of the parent
    # may have held the lock at the fork: the child starts afresh
    global _pool_lock
    _pool_lock = threading.Lock()
    _pool[:] = None, 0


os.register_at_fork(after_in_child=_after_fork_in_child)


def run_tasks(fn, tasks, *args):
    """fn(*args, i) for i in range(tasks) on up to Numba's thread count of threads,
    fn a ``nogil`` kernel: Python threads run its tasks at once.

    Not a ``prange`` loop: on a cold cache the Winograd convolution's two
    loops compiled for 5 and 10 s beyond the serial functions they call
    (Numba's compile events, 2026-12-06; the callee is likely optimised again
    inside the loop's own module), and ran no faster.  One thread runs the tasks
    in order; a process forked from one with a pool makes a pool of its own
    (its parent's threads are not in it), with a lock of its own
    (``_after_fork_in_child``)."""
    n = min(tasks, numba.get_num_threads())
    if n <= 1:
        for i in range(tasks):
            fn(*args, i)
        return
    with _pool_lock:
        if _pool[1] < n:
            from concurrent.futures import ThreadPoolExecutor

            if _pool[0] is not None:
                _pool[0].shutdown(wait=False)        # too few threads: its idle ones end
            _pool[:] = ThreadPoolExecutor(n, thread_name_prefix="commrt-kernel"), n
        pool = _pool[0]
    for f in [pool.submit(fn, *args, i) for i in range(tasks)]:
        f.result()
