"""gatherv: rank q's block (counts[q] elements) to its place in the root's
packed out; counts are needed at the root only.  One module per algorithm
(collectives/registry.py)."""
