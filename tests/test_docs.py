"""The docs that are generated from code stay true."""
import pathlib

from commrt import config

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def test_configuration_doc_lists_every_knob():
    text = (DOCS / "configuration.md").read_text()
    assert config.describe() in text, "regenerate: python -m commrt.config > docs/configuration.md"


def test_a_knob_set_empty_means_unset_unless_it_says_otherwise(monkeypatch):
    monkeypatch.setenv("COMMRT_TIMEOUT", "")
    assert config.get("COMMRT_TIMEOUT") == config.KNOBS["COMMRT_TIMEOUT"].default
    monkeypatch.setenv("COMMRT_COST_CACHE", "")
    assert config.get("COMMRT_COST_CACHE") is None
    monkeypatch.delenv("COMMRT_COST_CACHE")
    assert config.get("COMMRT_COST_CACHE") == config.KNOBS["COMMRT_COST_CACHE"].default
