"""Issue 59: numbers the docs state about the repository are the repository's."""

import json
import re

from tests.docs.doc_commands import REPO


def test_configuration_md_counts_the_verl_commands_the_tests_hold():
    text = (REPO / "docs/configuration.md").read_text()
    stated = re.search(r"holds the launch commands of (\d+) of verl's", text)
    commands = json.loads((REPO / "tests/verl_commands/commands.json").read_text())
    assert stated and int(stated.group(1)) == len(commands), "update the count in docs/configuration.md"
