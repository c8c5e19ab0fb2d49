"""The docs that are generated from code stay true."""
import pathlib

from commrt import config

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def test_configuration_doc_lists_every_knob():
    text = (DOCS / "configuration.md").read_text()
    assert config.describe() in text, "regenerate: python -m commrt.config > docs/configuration.md"
