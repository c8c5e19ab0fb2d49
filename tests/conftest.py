"""Tests marked `long` run only with COMMRT_LONG_TESTS=1: each is a second
transport, world size or launcher of a case the default suite already runs,
deselected (not skipped) so that CI's suite stays within its 20 minutes; and the
fixtures tests in several folders share.

The suite runs in two pytest-xdist workers (pyproject's addopts): about half of
a serial run's wall time is idle, its tests waiting on deadlines, sleeps and
process starts.  A file's tests stay on one worker (--dist loadfile: its
module and session fixtures are made once); tests marked `netns` run one at a
time (they make network namespaces and check that none is left behind); a test
marked `alone` runs with no test beside it (its assertion rests on what it
measures).  The files that take longest go first (FIRST), so that the workers
finish together: xdist hands out the files in this order
(--no-loadscope-reorder).  (Not --dist loadgroup: pytest-xdist 3.8 groups by
rewriting item._nodeid, which pytest 9.2 no longer reads.)"""
import contextlib
import fcntl
import os

import pytest

from commrt import config as commrt_config

# torch's suite forks its ranks from this process (tests/torch/test_torch_suite.py),
# and a child of a process whose OpenMP pool has threads crashes (SIGSEGV) in its
# first parallel region; which tests ran before it in this process varies (workers)
os.environ.setdefault("OMP_NUM_THREADS", "1")


# The files over 60 s in a parallel run of 2026-12-08, longest first: the rest
# follow in collection order.
FIRST = ("tests/collectives/test_plans.py", "tests/collectives/test_collectives_property.py",
         "tests/torch/test_backend.py", "tests/faults/test_soak_and_leaks.py",
         "tests/comm/test_abort.py", "tests/torch/test_torch_launchers.py",
         "tests/scale/test_ns_hosts.py")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "long: runs only with COMMRT_LONG_TESTS=1 (a variant of a default test)")
    config.addinivalue_line(
        "markers", "netns: makes network namespaces; such tests run one at a time")
    config.addinivalue_line(
        "markers", "alone: runs with no other test beside it when workers run in parallel")


def pytest_report_header(config):
    return ("commrt long tests: run (COMMRT_LONG_TESTS=1)" if _long()
            else "commrt long tests: deselected (COMMRT_LONG_TESTS=1 runs them)")


def pytest_collection_modifyitems(config, items):
    if not _long():
        drop = [item for item in items if item.get_closest_marker("long")]
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = [item for item in items if not item.get_closest_marker("long")]
    rank = {path: i for i, path in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(FIRST)))  # stable


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's timer
def pytest_runtest_protocol(item, nextitem):
    if getattr(item.config, "workerinput", None) is None:   # not an xdist worker's own process
        yield
        return
    # the workers' temporary folders share a parent, which pytest removes in time
    base = os.path.join(os.path.dirname(item.config.option.basetemp), "turn")
    with _turn(base, alone=item.get_closest_marker("alone") is not None,
               netns=item.get_closest_marker("netns") is not None):
        yield


@contextlib.contextmanager
def _turn(base, alone, netns):
    """A shared hold on the run's lock for an ordinary test, the whole lock for
    one marked `alone`.  An alone test holds the gate while it waits, so the
    other worker starts nothing new meanwhile (writers first: it cannot starve).
    A test marked `netns` also holds the namespaces' lock, alone among those."""
    with contextlib.ExitStack() as held:
        gate, lock, ns = (held.enter_context(open(f"{base}.{name}", "a"))
                          for name in ("gate", "lock", "netns"))
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        if netns:  # after the turn: whoever holds this lock holds all it needs
            fcntl.flock(ns, fcntl.LOCK_EX)
        try:
            yield
        finally:
            for f in (ns, lock, gate):
                fcntl.flock(f, fcntl.LOCK_UN)


def _long():
    return commrt_config.get("COMMRT_LONG_TESTS")


@pytest.fixture
def thp_mode():
    """The kernel's transparent huge page mode: "always", "madvise" or "never"
    (also where the kernel has none)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "never"


@pytest.fixture
def pages_under():
    """f(array) -> (start, end, AnonHugePages kB, THPeligible) of the mapping
    holding the array, from /proc/self/smaps."""
    return _pages_under


def _pages_under(a):
    """The kernel's page size(s) under array a, from /proc/self/smaps: the
    mapping holding it, and whether any of it sits on huge pages."""
    lo = a.ctypes.data
    with open("/proc/self/smaps") as f:
        text = f.read().split("\n")
    for i, line in enumerate(text):
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:
            start, end = (int(x, 16) for x in head[0].split("-"))
            if start <= lo < end:
                fields = {}
                for entry in text[i + 1:]:
                    parts = entry.split()
                    if parts and "-" in parts[0] and len(parts) >= 5:
                        break
                    if len(parts) >= 2 and parts[0].endswith(":"):
                        fields[parts[0][:-1]] = parts[1]
                return start, end, int(fields.get("AnonHugePages", 0)), fields.get("THPeligible")
    raise AssertionError("no mapping holds the buffer")
