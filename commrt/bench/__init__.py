"""Benchmarks, one module per name: ``python -m commrt.bench NAME [options]``.

Each module ``commrt/bench/NAME.py`` defines ``main(argv) -> int`` and a
module docstring whose first line is its summary.
"""
