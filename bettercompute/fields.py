"""Field rules declared once: each is the attrs validator that enforces it and the JSON Schema that publishes it.

An input field names its rule as its validator::

    ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")

    @attrs.frozen(kw_only=True)
    class GetPoolInput:
        id: str = attrs.field(validator=ID)

The codec reports a refusal as ``INVALID_INPUT`` at the field's path, and ``json_schema`` merges the rule's keywords
into the field's schema, so the OpenAPI document promises exactly what is enforced: a request valid by the document
passes these rules, and one that breaks a published keyword is refused. A rule that no keyword can express (a URL's
parts) stays a plain validator beside these; keep such rules few, as a client cannot see them.

Patterns are Python regular expressions matched against the whole value. They are published anchored, and must keep
to the syntax Python and ECMA-262 (JSON Schema's dialect) read alike: character classes, groups, alternation, and
bounded repetition, with no ``\\d``, ``\\w`` or ``\\s`` (Unicode-wide in one, ASCII in the other).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = ["Entries", "Integer", "Items", "Number", "Rule", "Text", "rules_of"]


def _refuse(attribute: attrs.Attribute[Any], reason: str) -> ValueError:
    # ``(reason, attribute, ...)`` is the shape the codec reads to put the reason at the field's path. The value is
    # left out: it may be a secret.
    return ValueError(reason, attribute, "<hidden>")


@attrs.frozen(kw_only=True)
class Text:
    """A string: a length range (in code points) and a pattern the whole value must match. ``None`` passes."""

    reason: str
    pattern: str | None = None
    min_length: int | None = None
    max_length: int | None = None
    _compiled: re.Pattern[str] | None = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_compiled", re.compile(self.pattern) if self.pattern is not None else None)

    def problem(self, value: str) -> str | None:
        """Why ``value`` breaks the rule, or ``None``."""
        if self.min_length is not None and len(value) < self.min_length:
            return self.reason
        if self.max_length is not None and len(value) > self.max_length:
            return self.reason
        if self._compiled is not None and not self._compiled.fullmatch(value):
            return self.reason
        return None

    def __call__(self, instance: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
        if value is not None:
            reason = self.problem(value)
            if reason is not None:
                raise _refuse(attribute, reason)

    def schema(self) -> dict[str, Any]:
        """The JSON Schema keywords of the rule."""
        out: dict[str, Any] = {}
        if self.pattern is not None:
            out["pattern"] = f"^(?:{self.pattern})$"
        if self.min_length is not None:
            out["minLength"] = self.min_length
        if self.max_length is not None:
            out["maxLength"] = self.max_length
        return out


def _bounds(minimum: float | None, maximum: float | None) -> dict[str, Any]:
    """A number rule's JSON Schema keywords: the bounds it has."""
    out: dict[str, Any] = {}
    if minimum is not None:
        out["minimum"] = minimum
    if maximum is not None:
        out["maximum"] = maximum
    return out


@attrs.frozen(kw_only=True)
class Integer:
    """An integer within ``minimum`` and ``maximum``, both included. ``None`` passes."""

    reason: str
    minimum: int | None = None
    maximum: int | None = None

    def __call__(self, instance: Any, attribute: attrs.Attribute[Any], value: int | None) -> None:
        if value is None:
            return
        reason = self.problem(value)
        if reason is not None:
            raise _refuse(attribute, reason)

    def problem(self, value: Any) -> str | None:
        """Why ``value`` breaks the rule, or ``None`` when it keeps it."""
        if isinstance(value, bool) or not isinstance(value, int):
            return "must be an integer"
        if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
            return self.reason
        return None

    def schema(self) -> dict[str, Any]:
        """The JSON Schema keywords of the rule."""
        return _bounds(self.minimum, self.maximum)


@attrs.frozen(kw_only=True)
class Number:
    """A finite number (an integer or a float, never NaN or an infinity) within ``minimum`` and ``maximum``, both
    included. ``None`` passes."""

    reason: str
    minimum: float | None = None
    maximum: float | None = None

    def __call__(self, instance: Any, attribute: attrs.Attribute[Any], value: float | None) -> None:
        if value is None:
            return
        reason = self.problem(value)
        if reason is not None:
            raise _refuse(attribute, reason)

    def problem(self, value: Any) -> str | None:
        """Why ``value`` breaks the rule, or ``None`` when it keeps it."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "must be a number"
        if not math.isfinite(value):
            return "must be a finite number"
        if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
            return self.reason
        return None

    def schema(self) -> dict[str, Any]:
        """The JSON Schema keywords of the rule."""
        return _bounds(self.minimum, self.maximum)


@attrs.frozen(kw_only=True)
class Items:
    """A list: its length, each item's rule, and whether an item may repeat. ``None`` passes."""

    reason: str
    item: Text | Integer | None = None
    min_items: int | None = None
    max_items: int | None = None
    unique: bool = False

    def __call__(self, instance: Any, attribute: attrs.Attribute[Any], value: Sequence[Any] | None) -> None:
        if value is None:
            return
        if (self.min_items is not None and len(value) < self.min_items) or (
            self.max_items is not None and len(value) > self.max_items
        ):
            raise _refuse(attribute, self.reason)
        if self.item is not None:
            for index, item in enumerate(value):
                reason = self.item.problem(item)
                if reason is not None:
                    raise _refuse(attribute, f"item {index} {reason}")
        if self.unique and len(set(value)) != len(value):
            raise _refuse(attribute, "lists an item twice")

    def schema(self) -> dict[str, Any]:
        """The JSON Schema keywords of the rule (the item's go under ``items``)."""
        out: dict[str, Any] = {}
        if self.item is not None:
            out["items"] = self.item.schema()
        if self.min_items is not None:
            out["minItems"] = self.min_items
        if self.max_items is not None:
            out["maxItems"] = self.max_items
        if self.unique:
            out["uniqueItems"] = True
        return out


@attrs.frozen(kw_only=True)
class Entries:
    """A map of strings: how many entries, and the rules of its keys and values. ``None`` passes."""

    reason: str
    key: Text | None = None
    value: Text | None = None
    max_entries: int | None = None

    def __call__(self, instance: Any, attribute: attrs.Attribute[Any], value: Mapping[str, str] | None) -> None:
        if value is None:
            return
        if self.max_entries is not None and len(value) > self.max_entries:
            raise _refuse(attribute, self.reason)
        for key, item in value.items():
            # The key is not quoted back: the path names the map, and the reason says which rule it broke.
            if self.key is not None and (reason := self.key.problem(key)) is not None:
                raise _refuse(attribute, f"a key {reason}")
            if self.value is not None and (reason := self.value.problem(item)) is not None:
                raise _refuse(attribute, f"a value {reason}")

    def schema(self) -> dict[str, Any]:
        """The JSON Schema keywords of the rule (the values' go under ``additionalProperties``)."""
        out: dict[str, Any] = {}
        if self.key is not None:
            out["propertyNames"] = self.key.schema()
        if self.value is not None:
            out["additionalProperties"] = self.value.schema()
        if self.max_entries is not None:
            out["maxProperties"] = self.max_entries
        return out


Rule = Text | Integer | Number | Items | Entries


def rules_of(field: attrs.Attribute[Any]) -> list[Rule]:
    """The declared rules among ``field``'s validators (a list of validators included)."""
    found: list[Rule] = []
    pending: list[Any] = [field.validator]
    while pending:
        validator = pending.pop()
        if isinstance(validator, Text | Integer | Number | Items | Entries):
            found.append(validator)
        # attrs wraps a list of validators in an and_ validator, which keeps them in ``_validators``.
        pending.extend(getattr(validator, "_validators", ()))
    return found
