"""The strict JSON encoder used for args, input and results (pure Python, no database)."""

from __future__ import annotations

import json
from collections import OrderedDict
from enum import IntEnum
from typing import Any
from uuid import uuid4

import pytest

from treadle import InvalidArgument
from treadle._json import to_json, to_jsonb


class Level(IntEnum):
    HIGH = 2


def test_what_json_holds_goes_through_unchanged() -> None:
    shared = {"k": [1, 2]}
    value = {
        "text": "héllo ☃ \u2028",
        "int": 10**30,
        "float": -1.25e-7,
        "bool": False,
        "none": None,
        "list": [1, [2, [3]]],
        "tuple": (1, 2),
        "shared": [shared, shared],
        "ordered": OrderedDict(a=1),
        "enum": Level.HIGH,
        "": "empty key",
    }
    assert json.loads(to_json(value, "args")) == json.loads(json.dumps(value))


def test_none_stays_sql_null_and_values_become_jsonb() -> None:
    assert to_jsonb(None, "args") is None
    param = to_jsonb({"a": [1]}, "args")
    assert param is not None and param.obj == '{"a":[1]}'


def test_deep_but_finite_nesting_is_fine() -> None:
    value: Any = "leaf"
    for _ in range(200):
        value = {"down": [value]}
    assert to_json(value, "args").count("down") == 200


def test_nesting_too_deep_to_encode() -> None:
    value: Any = []
    for _ in range(100_000):
        value = [value]
    with pytest.raises(InvalidArgument, match="args is nested too deeply"):
        to_json(value, "args")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("nan"), "args is nan: JSON has no NaN or infinity"),
        ({"a": {"b": [0, float("inf")]}}, r"args\['a'\]\['b'\]\[1\] is inf"),
        ([float("-inf")], r"args\[0\] is -inf"),
        ({"s": frozenset()}, r"args\['s'\] is a frozenset.*use a list"),
        ({"b": bytearray(b"x")}, "is a bytearray.*base64"),
        ({"u": uuid4()}, r"is a UUID.*str\(uuid\)"),
        ({(1, 2): "tuple key"}, r"key \(1, 2\) of type tuple"),
        ({None: 1}, "key None of type NoneType"),
        ({True: 1}, "key True of type bool"),
        ({"nul": "a\x00b"}, r"args\['nul'\] contains a NUL character"),
        ({"a\x00": 1}, "key 'a\\\\x00' contains a NUL character"),
        ({"bad": "\ud800"}, r"args\['bad'\] is not valid Unicode text"),
        ({"f": print}, "is a builtin_function_or_method"),
    ],
)
def test_refused_values_name_where_they_are(value: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as refused:
        to_json(value, "args")
    assert refused.value.sqlstate is None


def test_circular_structures() -> None:
    loop: dict[str, Any] = {"a": {"b": []}}
    loop["a"]["b"].append(loop)
    with pytest.raises(InvalidArgument, match=r"args\['a'\]\['b'\]\[0\] contains itself"):
        to_json(loop, "args")
    selfish: list[Any] = []
    selfish.append(selfish)
    with pytest.raises(InvalidArgument, match=r"args\[0\] contains itself"):
        to_json(selfish, "args")


def test_text_that_looks_like_an_escaped_nul_is_kept() -> None:
    # the encoder's output holds "\\u0000" here, as it would for a NUL: only the walk tells them apart
    value = {"path": "C:\\u0000", "note": "\\\\u0000"}
    assert json.loads(to_json(value, "args")) == value


def test_an_integer_key_is_refused_not_turned_into_text() -> None:
    with pytest.raises(InvalidArgument, match="key 1 of type int"):
        to_json({"ok": {1: "one"}}, "args")


def test_a_large_plain_value_is_encoded_whole() -> None:
    value = [{"i": i, "tags": ["a", "b"]} for i in range(400_000)]  # more items than the quick pass takes
    assert json.loads(to_json(value, "args")) == value
