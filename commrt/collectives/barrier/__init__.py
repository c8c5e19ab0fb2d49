"""Barrier: no rank leaves before every rank has entered.  One module per
algorithm (collectives/registry.py)."""
