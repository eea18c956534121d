"""treadle's public names: `__all__` (what type checkers see) is what the package loads lazily."""

from __future__ import annotations

import importlib

import treadle


def test_all_names_every_lazily_loaded_name() -> None:
    assert sorted(treadle.__all__) == sorted(treadle._EXPORTS)
    assert len(set(treadle.__all__)) == len(treadle.__all__)


def test_every_public_name_loads_from_its_module() -> None:
    for name, module in treadle._EXPORTS.items():
        assert getattr(treadle, name) is getattr(importlib.import_module(f"treadle.{module}"), name), name
    assert set(treadle._EXPORTS) <= set(dir(treadle))


def test_every_client_function_is_public() -> None:
    from treadle import client

    assert set(client.__all__) <= set(treadle.__all__)
    assert {"retry_many", "cancel_many"} <= set(client.__all__)
