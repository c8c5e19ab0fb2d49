"""All-to-all: block j of rank i's buf becomes block i of rank j's out.  One
module per algorithm (collectives/registry.py)."""
