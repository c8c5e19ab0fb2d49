"""tests/torch: torch's generic suite runs its CI subset unless COMMRT_TORCH_FULL=1
(the other tests are deselected, not skipped: see test_torch_suite.py)."""


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        mod = getattr(item, "module", None)
        suite = mod is not None and mod.__name__.endswith("test_torch_suite")
        if suite and not mod.FULL and item.name not in mod.CURATED:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
