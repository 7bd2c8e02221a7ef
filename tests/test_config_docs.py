"""docs/config.md is generated from the schema: it must match, and every key must be documented."""

import dataclasses
import typing
from pathlib import Path

from mentor_fast.config import schema
from mentor_fast.config.docs import _field_docs, _sections, render

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def test_the_config_page_is_up_to_date():
    assert DOC.read_text() == render(), (
        "docs/config.md is out of date: run `python -m mentor_fast.config.docs > docs/config.md`")


def test_every_key_has_a_docstring():
    missing = []
    for name, cls in _sections(schema.RunConfig, ""):
        hints, docs = typing.get_type_hints(cls), _field_docs(cls)
        missing += [f"{name}.{f.name}" for f in dataclasses.fields(cls)
                    if not dataclasses.is_dataclass(hints[f.name]) and not docs.get(f.name)]
    assert not missing, missing
