"""`python -m felix_codegen`: validate the catalogue and (re)write the generated layer."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .load import CatalogueError, load
from .render import write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="felix_codegen", description=__doc__)
    parser.add_argument("--spec", type=Path, default=Path("spec"), help="catalogue folder")
    parser.add_argument(
        "--out", type=Path, default=Path("generated/felix_wire"), help="package folder to write"
    )
    parser.add_argument("--check", action="store_true", help="validate only; write nothing")
    args = parser.parse_args(argv)
    try:
        cat = load(args.spec)
    except CatalogueError as exc:
        print(f"felix_codegen: {exc}", file=sys.stderr)
        return 1
    if args.check:
        print(
            f"catalogue ok: {len(cat.messages)} messages, {len(cat.flags)} flags, "
            f"{len(cat.features)} features, {len(cat.error_codes)} error codes, "
            f"{len(cat.requirements.items) if cat.requirements else 0} requirements; "
            f"fleet: {len(cat.fleet.messages) if cat.fleet else 0} peer messages, "
            f"{len(cat.fleet.records) if cat.fleet else 0} records"
        )
        return 0
    written = write(cat, args.out)
    print(f"wrote {len(written)} files to {args.out} (spec {cat.spec_hash[:12]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
