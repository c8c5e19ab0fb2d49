"""Broadcast: the root's buffer to every rank.  One module per algorithm
(collectives/registry.py)."""
