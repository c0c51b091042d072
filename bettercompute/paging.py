"""One paging convention for every list method: ``limit`` and ``cursor`` in, ``next_cursor`` out.

A list method's input subclasses ``PageInput``; its output has one tuple of items (named for what it holds:
``pools``, ``tenants``, ...) and ``next_cursor: str | None``. The registry recognizes a list method by these fields
(or by its name, ``list``) and refuses one that breaks the convention with ``INVALID_CONFIG``.

Items come in a stable order by a unique key (``(created_at, id)``, a name unique in its tenant, a serial id), and
each page is read with keyset pagination: the store returns the rows after the last key of the previous page, never
an ``OFFSET``. ``next_cursor`` is ``None`` on the last page.

A cursor is opaque to callers: URL-safe base64 of the method's action and the last key. A cursor that does not decode
to a key of the expected shape, or was made by another method, is ``INVALID_INPUT``. A cursor gives no access: every
list filters by its tenant (and pool or principal) whatever the cursor holds, so a forged key can only move where a
caller's own rows start.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import functools
import json
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import attrs

from bettercompute.errors import InvalidInputError
from bettercompute.fields import Integer, Text

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_CURSOR",
    "MAX_LIMIT",
    "KeyPart",
    "Keyset",
    "PageInput",
    "convention_problems",
    "is_list_method",
    "items_field",
]

DEFAULT_LIMIT = 100
"""Items per page when a caller names no ``limit``."""

MAX_LIMIT = 1000
"""The most items one page may hold."""

MAX_CURSOR = 1024
"""The longest cursor accepted; every cursor this module makes is far shorter."""

_CURSOR = re.compile(r"[A-Za-z0-9_-]+")
_MAX_KEY_TEXT = 512
_INT64 = 2**63

_T = TypeVar("_T")
KeyPart = str | int | bool | dt.datetime
"""One part of a sort key."""


# Only the cursor's shape here (published in the OpenAPI document); whether it decodes to a key is the list's own
# check, which knows the key's shape.
_LIMIT = Integer(minimum=1, maximum=MAX_LIMIT, reason=f"must be between 1 and {MAX_LIMIT}")
_CURSOR_SHAPE = Text(pattern=_CURSOR.pattern, max_length=MAX_CURSOR, reason="is not a cursor returned by this list")


@attrs.frozen(kw_only=True)
class PageInput:
    """The paging fields of every list method's input: subclass it.

    ``limit`` is how many items one page holds (1 to ``MAX_LIMIT``); ``cursor`` is a previous page's
    ``next_cursor``, or null for the first page.
    """

    limit: int = attrs.field(default=DEFAULT_LIMIT, validator=_LIMIT)
    cursor: str | None = attrs.field(default=None, validator=_CURSOR_SHAPE)


def _bad_cursor() -> InvalidInputError:
    # The cursor itself is never echoed: it is caller-controlled bytes.
    reason = "is not a cursor returned by this list"
    return InvalidInputError(f"cursor: {reason}", details={"path": "cursor", "reason": reason})


def _encode_part(value: KeyPart) -> Any:
    return value.isoformat() if isinstance(value, dt.datetime) else value


def _decode_part(value: Any, tp: type) -> KeyPart:
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        # Bounded to PostgreSQL's bigint: a larger number would fail in the database, not here.
        if isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value < _INT64:
            return value
    elif tp is str:
        # No NUL and no unpaired surrogate: PostgreSQL cannot carry either, and JSON escapes can spell both.
        if isinstance(value, str) and len(value) <= _MAX_KEY_TEXT and "\x00" not in value:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise _bad_cursor() from None
            return value
    elif tp is dt.datetime and isinstance(value, str) and len(value) <= 64:
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            raise _bad_cursor() from None
        if parsed.tzinfo is not None:
            return parsed
    raise _bad_cursor()


class Keyset(Generic[_T]):
    """The sort key of one list: the types of its parts and how to read it from an item.

    Args:
        *types: The key's parts, each ``str``, ``int``, ``bool`` or ``datetime.datetime``.
        key: Reads the key of an item (the store orders by the same columns).
    """

    def __init__(self, *types: type, key: Callable[[_T], tuple[KeyPart, ...]]) -> None:
        self._types = types
        self._key = key

    def after(self, scope: str, cursor: str | None) -> tuple[KeyPart, ...] | None:
        """The key a page starts after (``None`` for the first page).

        Args:
            scope: The list's action (``call.method.action``): a cursor of another list is refused.
            cursor: The caller's ``cursor``.

        Raises:
            InvalidInputError: the cursor is not one this list made.
        """
        if cursor is None:
            return None
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            data = json.loads(raw)
        except (binascii.Error, ValueError, RecursionError):
            raise _bad_cursor() from None
        if not isinstance(data, dict) or data.get("m") != scope:
            raise _bad_cursor()
        parts = data.get("k")
        if not isinstance(parts, list) or len(parts) != len(self._types) or set(data) != {"m", "k"}:
            raise _bad_cursor()
        return tuple(_decode_part(value, tp) for value, tp in zip(parts, self._types, strict=True))

    def cursor(self, scope: str, item: _T) -> str:
        """The cursor of the page that starts after ``item``."""
        body = {"m": scope, "k": [_encode_part(part) for part in self._key(item)]}
        raw = json.dumps(body, separators=(",", ":"), ensure_ascii=True).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    def page(self, scope: str, rows: Sequence[_T], limit: int) -> tuple[tuple[_T, ...], str | None]:
        """One page out of ``rows`` read with ``limit + 1``: the first ``limit`` and the cursor after them.

        The extra row only says that there is more; ``next_cursor`` is ``None`` when it is missing.
        """
        items = tuple(rows[:limit])
        if len(rows) <= limit or not items:
            return items, None
        return items, self.cursor(scope, items[-1])


# --- the convention, checked at registration --------------------------------------------------------------------


@functools.cache
def _fields(cls: type) -> Mapping[str, Any]:
    # Asked for every method each time a control plane is made; resolving a class's string annotations again each
    # time was most of what ``better_compute()`` cost (about 11 ms of its 16 ms with the built-in modules).
    if not (isinstance(cls, type) and attrs.has(cls)):
        return MappingProxyType({})
    hints = typing.get_type_hints(cls)
    return MappingProxyType({f.name: hints[f.name] for f in attrs.fields(cls)})


def _is_items(tp: Any) -> bool:
    args = typing.get_args(tp)
    return typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis


def is_list_method(name: str, input: type, output: type) -> bool:
    """Whether a method is a list: named ``list``, or carrying a paging field in its input or output."""
    return name == "list" or bool({"limit", "cursor"} & _fields(input).keys()) or "next_cursor" in _fields(output)


def items_field(output: type) -> str:
    """The name of a list output's tuple of items."""
    (name,) = [name for name, tp in _fields(output).items() if _is_items(tp)]
    return name


def convention_problems(where: str, *, name: str, input: type, output: type, mutates: bool) -> list[str]:
    """Why a method that is a list breaks the convention (empty when it is not a list, or keeps it)."""
    if not is_list_method(name, input, output):
        return []
    problems = []
    if not (isinstance(input, type) and issubclass(input, PageInput)):
        problems.append(f"{where}: a list's input must subclass bettercompute.paging.PageInput (limit, cursor)")
    fields = _fields(output)
    if fields.get("next_cursor") != str | None:
        problems.append(f"{where}: a list's output must have 'next_cursor: str | None'")
    items = [field for field, tp in fields.items() if _is_items(tp)]
    if len(items) != 1 or set(fields) != {items[0], "next_cursor"}:
        problems.append(f"{where}: a list's output must hold exactly one tuple of items and 'next_cursor'")
    if mutates:
        problems.append(f"{where}: a list must not mutate")
    return problems
