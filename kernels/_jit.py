"""The one place kernels import Numba from.

Numba's OpenMP threading layer kills a process that forks after using it,
and ranks may be started by fork (multiprocessing, some launchers): pick the
fork-safe ``workqueue`` layer unless the user chose one.
"""
import os

import numba

if not os.environ.get("NUMBA_THREADING_LAYER"):
    numba.config.THREADING_LAYER = "workqueue"

from numba import njit, prange  # noqa: E402,F401
