"""The keys a pydantic model accepts at a place in a document, for "unknown field" messages
that list them and suggest the closest (``yamlfile.validate``). Pure: it reads annotations.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from typing import Any

import pydantic

KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class KnownKeys:
    """What a mapping may hold: its keys, in the order to list them, and what they are called
    (a model may say: ``KEY_NOUN = "step kind"``, ``KEY_ORDER`` for those listed first)."""

    names: list[str]
    noun: str


def unknown_key(
    model: type[pydantic.BaseModel], path: KeyPath, key: str, field: str
) -> tuple[str, str | None, str | None]:
    """What to say about ``key`` where ``model`` takes no such key (``path``: the mapping it
    stands in): ``x.y.colour: unknown field 'colour'``, the keys it may be, and the closest."""
    known = known_keys(model, path)
    if known is None:
        return (f"{field}: unknown field", None, None)
    close = difflib.get_close_matches(key, known.names, n=1, cutoff=0.6)
    return (
        f"{field}: unknown {known.noun} {key!r}",
        f"one of {', '.join(known.names)}",
        f"did you mean {close[0]}?" if close else None,
    )


def known_keys(model: type[pydantic.BaseModel], path: KeyPath) -> KnownKeys | None:
    """The keys of the mapping at ``path`` inside ``model``'s data; None where one model alone
    does not decide (a union of models)."""
    owner = model_at(model, path)
    if owner is None:
        return None
    names = [info.alias or name for name, info in owner.model_fields.items()]
    first = [n for n in getattr(owner, "KEY_ORDER", ()) if n in names]
    names = [*first, *(n for n in names if n not in first)]
    return KnownKeys(names, getattr(owner, "KEY_NOUN", "field"))


def _models_in(annotation: Any) -> list[type[pydantic.BaseModel]]:
    """The pydantic models an annotation may hold at its top level (through Optional,
    unions and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def _inner(annotation: Any) -> Any:
    """What one item of a list, tuple or dict annotation holds."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    args = [a for a in typing.get_args(annotation) if a is not Ellipsis and a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return _inner(args[0])
    if typing.get_origin(annotation) in (tuple, list, dict) and args:
        return args[-1]
    return None


def _field_named(model: type[pydantic.BaseModel], key: str | int) -> Any:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return info.annotation
    return None


def model_at(model: type[pydantic.BaseModel], path: KeyPath) -> type[pydantic.BaseModel] | None:
    """The model that validates the mapping at ``path`` (relative to ``model``'s data), when
    one model alone does; None where it cannot be told."""
    annotation: Any = model
    for part in path:
        models = _models_in(annotation)
        if len(models) == 1:
            annotation = _field_named(models[0], part)
        elif not models:
            annotation = _inner(annotation)
        else:
            return None
        if annotation is None:
            return None
    models = _models_in(annotation)
    return models[0] if len(models) == 1 else None
