"""Reduce-scatter: buf holds N blocks; rank i gets block i reduced over all ranks
(in out).  One module per algorithm (collectives/registry.py)."""
