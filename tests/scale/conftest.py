"""Fixtures of the multi-host tests: pretend hosts as network namespaces (root)."""
import pytest

from commrt.bench import _netns
from scale_helpers import require


@pytest.fixture
def ns_hosts():
    """ns_hosts(count, rate=None) -> an entered _netns.Hosts; every one is torn
    down (processes killed, namespaces and links deleted) when the test ends,
    failed or not."""
    require(_netns.missing_tools(), "network namespaces")
    made = []

    def make(count, rate=None, **kw):
        hosts = _netns.Hosts(count, rate, **kw)
        made.append(hosts)
        return hosts.__enter__()

    yield make
    for hosts in made:
        hosts.__exit__()
    left = {n for n in _netns.existing() for h in made if n.startswith(h.name + "-")}
    assert not left, f"namespaces left behind: {sorted(left)}"
