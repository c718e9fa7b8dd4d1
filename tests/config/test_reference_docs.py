"""docs/configuration.md's reference is the dataclasses' keys, defaults and docstrings (issue 37)."""

import dataclasses
import pathlib

import pytest

from hybridflow.config import SCHEMAS
from hybridflow.config.loader import schema_keys
from hybridflow.config.reference import TRAINERS, markdown, rows

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_doc_holds_the_generated_reference():
    assert markdown() in DOCS.read_text(), (
        "docs/configuration.md is out of date: run python -m hybridflow.config.reference --write docs/configuration.md")


@pytest.mark.parametrize("trainer", TRAINERS)
def test_every_leaf_key_has_its_row(trainer):
    schema = SCHEMAS[trainer]
    leaves = [key for key, tp in schema_keys(schema).items() if not dataclasses.is_dataclass(tp)]
    listed = [row.split("`")[1] for row in rows(schema)]
    assert listed == leaves


def test_a_row_shows_the_default_and_the_docstring():
    table = rows(SCHEMAS["ppo"])
    assert "| `data.max_prompt_length` | `512` | Prompt length limit in tokens (after the chat template). |" in table
    assert '| `critic.rollout_n` | `"${actor_rollout_ref.rollout.n}"` | Follows rollout.n. |' in table  # as written
