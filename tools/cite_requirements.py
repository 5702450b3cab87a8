"""Rewrite citations of the external protocol facts file into citations of spec/requirements.yaml.

    python tools/cite_requirements.py           # rewrite in place, list what changed
    python tools/cite_requirements.py --check   # change nothing; exit 1 if anything would

Comments and docs used to cite "facts K4", "facts §5.8", "facts 14.7" or "facts §14
item 15", which resolved only in a document outside the repository. Requirement ids
and section numbers of spec/requirements.yaml keep their numbering, so the rewrite is
mechanical:

  facts 14.N / facts §14 item N   ->  UN   (the open item, with the decision taken)
  facts section N / facts §N      ->  §N
  facts N.M (a section number)    ->  §N.M
  facts K4, facts N4, Q1          ->  K4, N4, Q1

and, in a conformance transcript's `requirement:` sentence, a bare section number in
its closing parentheses gets its section sign: "(A3, 3.3)" -> "(A3, §3.3)".

Idempotent: rewritten text holds no "facts" prefix and no bare section number, so a
second run changes nothing. Re-run it after merging branches that moved such comments;
tests/wire/test_requirements.py then checks that every citation resolves.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Where citations live: hand-written code, tests, benchmarks, the spec, the kit's
# transcripts and the docs. generated/ is rendered from spec/ and never edited.
ROOTS = (
    "felix_broker",
    "felix_common",
    "felix_client",
    "felix_controlplane",
    "felix_transport",
    "conformance",
    "codegen",
    "bench",
    "tests",
    "spec",
    "docs",
)
SUFFIXES = {".py", ".yaml", ".yml", ".md", ".j2"}
# This script and its test spell the old citations on purpose.
SKIP = {"tools/cite_requirements.py", "tests/wire/test_requirements.py"}

ID = r"(?:[A-Z]{1,2}[1-9][0-9]?)"
SECTION = r"(?:1[0-9]|[1-9])(?:\.(?:1[0-9]|[0-9]))?"

RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bfacts §14 item (\d{1,2})\b"), r"U\1"),
    (re.compile(r"\bfacts 14\.(\d{1,2})\b"), r"U\1"),
    (re.compile(rf"\bfacts (?:section |§)({SECTION})\b"), r"§\1"),
    (re.compile(rf"\bfacts ({SECTION})\b"), r"§\1"),
    (re.compile(rf"\bfacts ({ID}\b)"), r"\1"),
)

# The closing parenthesised citation list of a transcript's requirement sentence.
TRANSCRIPT_REQUIREMENT = re.compile(r"^(requirement: .*\()([^()]*)(\)\.?\"?\s*)$", re.MULTILINE)
BARE_SECTION = re.compile(rf"^({SECTION})(\s.*)?$")


def _cite_sections(match: re.Match[str]) -> str:
    items = []
    for item in match.group(2).split(","):
        text = item.strip()
        bare = BARE_SECTION.match(text)
        items.append(f"§{bare.group(1)}{bare.group(2) or ''}" if bare else text)
    return match.group(1) + ", ".join(items) + match.group(3)


def rewrite(text: str, *, transcript: bool) -> str:
    for pattern, replacement in RULES:
        text = pattern.sub(replacement, text)
    if transcript:
        text = TRANSCRIPT_REQUIREMENT.sub(_cite_sections, text)
    return text


def files(repo: Path) -> list[Path]:
    found: list[Path] = []
    for root in ROOTS:
        base = repo / root
        if base.exists():
            found.extend(
                p
                for p in sorted(base.rglob("*"))
                if p.is_file()
                and p.suffix in SUFFIXES
                and p.relative_to(repo).as_posix() not in SKIP
            )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 on a change")
    parser.add_argument("--repo", type=Path, default=REPO, help="repository root")
    args = parser.parse_args(argv)
    changed = []
    for path in files(args.repo):
        old = path.read_text()
        new = rewrite(old, transcript="transcripts" in path.parts and path.suffix == ".yaml")
        if new != old:
            changed.append(path.relative_to(args.repo))
            if not args.check:
                path.write_text(new)
    for path in changed:
        print(path)
    if args.check and changed:
        print(f"{len(changed)} files cite the facts file; run tools/cite_requirements.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
