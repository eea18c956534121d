"""Strict JSON: values that JSON holds exactly, or a clear `InvalidArgument`.

The standard encoder quietly turns NaN into a token PostgreSQL refuses, integer
keys into strings and tuples into arrays it cannot tell apart from lists; some of
those surface as database errors that abort the caller's transaction, others as
data that reads back different. Here every value is checked first, so nothing is
sent when one is wrong, and the message names where the bad value sits.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any, TypeAlias

from psycopg.types.json import Jsonb

from .errors import InvalidArgument, UndecodablePayload

_SCALARS = (str, int, float, bool, type(None))
# json.dumps with options builds an encoder at every call; one, made once, serves all
_encode = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode


def to_json(value: Any, what: str) -> str:
    """JSON text for `value`; raises InvalidArgument naming the first bad part of `what`.

    Most values are plain (dicts with string keys, lists, strings, finite numbers):
    one quick pass over the containers says so, and the C encoder does the rest.
    Anything else, or text the encoder made that PostgreSQL would refuse, takes the
    slow walk, which names the bad part or finds none.
    """
    if _plain(value):
        try:
            text = _encode(value)
            if "\\u0000" not in text:  # a NUL, or a backslash before "u0000": the walk tells
                text.encode("utf-8")  # a lone surrogate raises: the walk names it
                return text
        except (ValueError, RecursionError, UnicodeEncodeError):
            pass  # the walk says why
    for path, item in _walk(value, what):
        _check_scalar(path, item)
    try:
        return _encode(value)
    except RecursionError:
        raise InvalidArgument(f"{what} is nested too deeply to encode as JSON") from None


def array_text(values: list[Any], what: Callable[[int], str]) -> str:
    """JSON text of the array `values`: each element as `to_json` makes it, None as null.

    One check and one encoder call for the whole list when it is plain; otherwise
    element by element, so that an error names its element as `what(index)`.
    """
    if _plain(values):
        try:
            text = _encode(values)
            if "\\u0000" not in text:
                text.encode("utf-8")
                return text
        except (ValueError, RecursionError, UnicodeEncodeError):
            pass  # the elements say why
    return "[" + ",".join("null" if value is None else to_json(value, what(index))
                          for index, value in enumerate(values)) + "]"  # fmt: skip


def _plain(value: Any) -> bool:
    """True when `value` holds only dicts with str keys, lists, tuples, str, int, float, bool and None."""
    stack = [value]
    pop, extend = stack.pop, stack.extend
    seen = 0
    while stack:
        item = pop()
        kind = type(item)
        if kind is dict:
            for key in item:
                if type(key) is not str:
                    return False
            extend(item.values())
        elif kind is list or kind is tuple:
            extend(item)
        elif not (kind is str or kind is int or kind is float or kind is bool or item is None):
            return False
        seen += 1
        if seen > _PLAIN_LIMIT:
            return False  # a structure this large may be circular: the walk checks
    return True


_PLAIN_LIMIT = 1_000_000  # items: more than a payload within the default size limit holds


def from_json(text: str | None, what: str) -> Any:
    """The value of JSON `text` read from the database (None stays None); UndecodablePayload when it cannot be."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except RecursionError:
        raise UndecodablePayload(
            f"{what} is nested too deeply for Python's JSON decoder ({len(text)} characters)"
        ) from None
    except ValueError as error:
        raise UndecodablePayload(f"{what} is not valid JSON: {error}") from None


def to_jsonb(value: Any, what: str) -> Jsonb | None:
    """A jsonb parameter for `value` (None stays SQL NULL), encoded and checked now."""
    if value is None:
        return None
    return Jsonb(to_json(value, what), dumps=_already_encoded)


def _already_encoded(text: str) -> str:
    return text


# A path is built only when an error names it: (parent path, "[key]"), or the root's name.
Path: TypeAlias = "str | tuple[Path, str]"


def _render(path: Path) -> str:
    parts: list[str] = []
    while isinstance(path, tuple):
        path, part = path
        parts.append(part)
    return path + "".join(reversed(parts))


def _walk(value: Any, root: str) -> Iterator[tuple[Path, Any]]:
    """Every scalar in `value` with its path; containers and keys are checked on the way.

    Iterative, so depth is no limit; `open_ids` holds the containers on the
    current path, and meeting one of them again means the structure is circular.
    """
    open_ids: set[int] = set()
    # (value, path, leaving): leaving=True pops a container off the current path
    stack: list[tuple[Any, Path, bool]] = [(value, root, False)]
    while stack:
        item, where, leaving = stack.pop()
        if leaving:
            open_ids.discard(id(item))
            continue
        if isinstance(item, dict):
            children = [(child, (where, f"[{_key(where, key)!r}]")) for key, child in item.items()]
        elif isinstance(item, (list, tuple)):
            children = [(child, (where, f"[{index}]")) for index, child in enumerate(item)]
        else:
            yield where, item
            continue
        if id(item) in open_ids:
            raise InvalidArgument(f"{_render(where)} contains itself: JSON cannot hold a circular structure")
        open_ids.add(id(item))
        stack.append((item, where, True))
        stack.extend((child, child_path, False) for child, child_path in reversed(children))


def _key(where: Path, key: Any) -> str:
    if not isinstance(key, str):
        raise InvalidArgument(
            f"{_render(where)} has the key {key!r} of type {type(key).__name__}: JSON object keys must be strings"
        )
    _check_text((where, f" key {key!r}"), key)
    return key


def _check_scalar(path: Path, item: Any) -> None:
    if isinstance(item, str):
        _check_text(path, item)
        return
    if not isinstance(item, _SCALARS):
        hint = _HINTS.get(type(item).__name__, "convert it to a string, number, list or dict first")
        raise InvalidArgument(f"{_render(path)} is a {type(item).__name__}, which JSON cannot hold: {hint}")
    if isinstance(item, float) and not math.isfinite(item):
        raise InvalidArgument(f"{_render(path)} is {item}: JSON has no NaN or infinity")


def _check_text(path: Path, text: str) -> None:
    if "\x00" in text:
        raise InvalidArgument(f"{_render(path)} contains a NUL character, which PostgreSQL cannot store")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidArgument(f"{_render(path)} is not valid Unicode text ({error.reason})") from None


_HINTS = {
    "set": "use a list",
    "frozenset": "use a list",
    "bytes": "decode it to text, or encode it as base64 text",
    "bytearray": "decode it to text, or encode it as base64 text",
    "datetime": "pass datetime.isoformat()",
    "date": "pass date.isoformat()",
    "Decimal": "pass a string or a float",
    "UUID": "pass str(uuid)",
}
