"""A playbook file's structure, rule by rule: each rule is validated on its own, so that one
rule's structure problem does not hide another rule's problems, and every problem of a file
comes in one run (``loader.py`` compiles the rules that validate)."""

from __future__ import annotations

from dataclasses import replace

from gpuwarden import yamlfile
from gpuwarden.errors import InputError, Problem
from gpuwarden.playbook.schema import PlaybookFile, Rule


def validated_rules(located: yamlfile.Located) -> tuple[list[tuple[int, Rule]], list[Problem]]:
    """The rules of a file that validate, by index, and the problems of the file's structure.
    Each rule is validated on its own, so that one rule's structure problem does not hide
    another rule's expression problem: both are reported in the same run."""
    data = located.data
    items = data.get("rules")
    if not isinstance(items, list):  # the file's own shape is wrong: say that, as a whole
        try:
            document = yamlfile.validate(PlaybookFile, located)
        except InputError as exc:
            return [], exc.problems
        return list(enumerate(document.rules)), []
    problems: list[Problem] = []
    try:
        yamlfile.validate(PlaybookFile, replace(located, data={**data, "rules": []}))
    except InputError as exc:
        problems.extend(exc.problems)
    valid: list[tuple[int, Rule]] = []
    for index in range(len(items)):
        try:
            valid.append((index, yamlfile.validate(Rule, located, ("rules", index))))
        except InputError as exc:
            problems.extend(exc.problems)
    return valid, problems
