"""Code the pages quote from a file (```python examples/x.py) is in that file, as shown.

The quoted files are examples that tests/docs/test_examples.py runs, so a quote that
matches its file shows code that runs.
"""

from __future__ import annotations

import pytest

from tests.docs.docblocks import ROOT, Block, excerpts

EXCERPTS = excerpts()


def test_use_cases_quote_their_examples() -> None:
    quoted = {b.source for b in EXCERPTS}
    assert {"examples/withdrawal.py", "examples/webhook.py"} <= quoted, quoted


@pytest.mark.parametrize("block", EXCERPTS, ids=[b.where for b in EXCERPTS])
def test_excerpt_is_in_its_file(block: Block) -> None:
    assert block.source is not None
    path = ROOT / block.source
    assert path.is_file() and path.resolve().is_relative_to(ROOT), f"{block.where}: no file {block.source}"
    assert block.code.strip() in path.read_text(), f"{block.where}: this text is not in {block.source}"
