"""The algorithms of every collective but all-reduce (which has its own package),
one module per collective family; each module's docstring gives the steps and
the α-β-γ cost of its algorithms."""
