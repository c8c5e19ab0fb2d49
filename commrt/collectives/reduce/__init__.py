"""Reduce: every rank's buffer combined element-wise, the result at the root;
non-root buffers are left unchanged.  One module per algorithm
(collectives/registry.py)."""
