"""Tests marked `long` run only with COMMRT_LONG_TESTS=1: each is a second
transport, world size or launcher of a case the default suite already runs,
deselected (not skipped) so that CI's suite stays within its 20 minutes; and the
fixtures tests in several folders share."""
import pytest

from commrt import config as commrt_config


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "long: runs only with COMMRT_LONG_TESTS=1 (a variant of a default test)")


def pytest_report_header(config):
    return ("commrt long tests: run (COMMRT_LONG_TESTS=1)" if _long()
            else "commrt long tests: deselected (COMMRT_LONG_TESTS=1 runs them)")


def pytest_collection_modifyitems(config, items):
    if _long():
        return
    drop = [item for item in items if item.get_closest_marker("long")]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if not item.get_closest_marker("long")]


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
