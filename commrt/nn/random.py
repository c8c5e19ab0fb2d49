"""Random state of the engine (dropout masks, weight initialisation).

``manual_seed(s)`` makes a run reproducible; one generator per array module.
"""
import numpy as np

_generators = {}
_seed = None


def manual_seed(seed):
    """Reseed every generator (NumPy now, CuPy when first used)."""
    global _seed
    _seed = int(seed)
    _generators.clear()


def generator(xp=np):
    """The engine's Generator for ``xp`` (numpy or cupy)."""
    gen = _generators.get(xp.__name__)
    if gen is None:
        gen = _generators[xp.__name__] = xp.random.default_rng(_seed)
    return gen
