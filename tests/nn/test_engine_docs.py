"""The examples in docs/engine.md run as written (doctest)."""
import doctest
import pathlib

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "engine.md"


def test_engine_guide_doctests():
    result = doctest.testfile(str(DOC), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 15
    assert result.failed == 0
