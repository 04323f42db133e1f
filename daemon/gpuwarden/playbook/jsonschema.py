"""The JSON Schema of playbook files (``gpuwarden schema``), so editors can complete them.

The structure comes from the pydantic models in ``schema.py``; the expression fields carry the
list of documented fields and functions, so an editor's hover shows what may be written there.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.playbook.fields import FIELDS, FUNCTIONS
from gpuwarden.playbook.schema import PlaybookFile

EXPRESSION_KEYS = ("when", "until", "select", "free_until")


def _expression_help() -> str:
    fields = ", ".join(sorted(FIELDS))
    functions = ", ".join(sorted(FUNCTIONS))
    return (
        f"An expression (docs/playbooks.md, Expressions). Fields: {fields}. Functions: {functions}."
    )


def _annotate(node: Any, help_text: str) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                for name in EXPRESSION_KEYS:
                    if name in value and isinstance(value[name], dict):
                        value[name].setdefault("description", help_text)
            _annotate(value, help_text)
    elif isinstance(node, list):
        for item in node:
            _annotate(item, help_text)


def playbook_schema() -> dict[str, Any]:
    schema = PlaybookFile.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "gpuwarden playbook"
    schema["description"] = "Rules and escalation ladders (docs/playbooks.md)."
    _annotate(schema, _expression_help())
    return schema
