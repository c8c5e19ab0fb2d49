"""Gather: one block per rank to the root.  One module per algorithm
(collectives/registry.py)."""
