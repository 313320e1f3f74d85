#!/usr/bin/env python3
"""Docs and comments say what is true now: no commit hash, no issue reference and no
before/after story in docs/, README.md or the comments of src/ (history goes to
CHANGELOG.md). Prints each offending line and exits 1 when there is one.

    scripts/check-docs.py        (scripts/test.sh runs it)
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A backticked run of 7-12 hex digits with a digit and a letter in it: a commit hash.
HASH = re.compile(r"`(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}`")
STORY = re.compile(
    r"\bissues?\b|\bissue's\b|\bused to be\b|\bit used to\b|\bformerly\b|"
    r"\b(?:before|after) this change\b|\bthe build before\b|\bbefore the http front\b",
    re.IGNORECASE,
)


def comment_of(line: str) -> str:
    """The comment part of a Rust line (`//`, `///`, `//!`), or '' (a string's `//` aside)."""
    for m in re.finditer("//", line):
        if line[: m.start()].count('"') % 2 == 0:
            return line[m.start():]
    return ""


def main() -> int:
    found = []
    texts = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    for path in texts:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if HASH.search(line) or STORY.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    for path in sorted((ROOT / "src").rglob("*.rs")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            c = comment_of(line)
            if c and (HASH.search(c) or STORY.search(c)):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    if found:
        print("check-docs: history belongs in CHANGELOG.md, not in docs or comments:", file=sys.stderr)
        print("\n".join("  " + f for f in found), file=sys.stderr)
        return 1
    print(f"check-docs: {len(texts)} docs and the comments under src/ state what is true now")
    return 0


if __name__ == "__main__":
    sys.exit(main())
