"""scatterv: block q (counts[q] elements) of the root's packed buf to rank q;
counts are needed at the root only.  One module per algorithm
(collectives/registry.py)."""
