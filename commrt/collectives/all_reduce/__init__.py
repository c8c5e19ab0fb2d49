"""All-reduce: every rank's buffer combined element-wise, the result on every
rank.  One module per algorithm (collectives/registry.py); _fold.py folds
a non-power-of-two world for recursive doubling and Rabenseifner."""
