"""all_to_allv: send_counts[q] elements of buf (packed in rank order) to rank q,
whose out receives them as its block r.  One module per algorithm
(collectives/registry.py)."""
