"""Merge per-rank timeline files: ``python -m collectives.timeline merge -o all.json trace.rank*.json``."""

from __future__ import annotations

import argparse
import sys

from ._timeline import merge, span

__all__ = ["merge", "span"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collectives.timeline")
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="join per-rank trace files into one Chrome trace")
    m.add_argument("files", nargs="+")
    m.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)
    count = merge(args.files, args.output)
    print(f"wrote {count} events from {len(args.files)} files to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
