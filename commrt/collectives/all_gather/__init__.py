"""All-gather: every rank's buffer, in rank order, on every rank (out holds N
blocks).  One module per algorithm (collectives/registry.py)."""
