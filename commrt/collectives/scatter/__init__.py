"""Scatter: block i of the root's buffer to rank i.  One module per algorithm
(collectives/registry.py)."""
