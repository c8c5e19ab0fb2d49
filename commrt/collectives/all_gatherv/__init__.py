"""all_gatherv: every rank's block (counts[q] elements for rank q), packed in rank
order, on every rank.  A zero count is an empty message, still sent and
checked, so counts that disagree across ranks raise CollectiveMismatchError
naming the sizes, never a hang.  One module per algorithm
(collectives/registry.py)."""
