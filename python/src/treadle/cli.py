"""The `treadle` command."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("treadle", file=sys.stderr)
    return 0
