#!/usr/bin/env python3
"""Docs and comments say what is true now, and each measured figure lives in one place.

1. No history: no commit hash, no issue reference and no before/after story in docs/,
   README.md or the comments of src/ (history goes to CHANGELOG.md). The docs are also held
   to a wider net of story phrases ("no longer", "it now takes", "an hour earlier", "before
   the last round", "used to" ...); the comments of src/ keep the narrower one, because
   there "no longer than" and "is used to" are ordinary words.
2. One place for figures: a speed (a number followed by tok/s, tokens/s, texts/s, req/s,
   GB/s or GFLOP/s) or a ratio written with two decimals and a multiplication sign (6.39×)
   stands in docs/performance.md only, beside the command that measures it; other docs link
   there. Two docs that quote a figure then cannot disagree, and a figure is updated in one
   place. Thresholds a test asserts ("≥ 0.8× polite") are not measurements and are written
   with fewer decimals or without those units, so the rule leaves them alone.

Prints each offending line and exits 1 when there is one.

    scripts/check-docs.py        (scripts/test.sh runs it)
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PERFORMANCE = ROOT / "docs" / "performance.md"

# A backticked run of 7-12 hex digits with a digit and a letter in it: a commit hash.
HASH = re.compile(r"`(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}`")
STORY = re.compile(
    r"\bissues?\b|\bissue's\b|\bused to be\b|\bit used to\b|\bformerly\b|"
    r"\b(?:before|after) this change\b|\bthe build before\b|\bbefore the http front\b",
    re.IGNORECASE,
)
# The wider net, for docs/ and README.md, matched across line breaks: phrases that tell how
# the code changed. `\s+` stands for the space, since a phrase may wrap.
DOC_STORY = re.compile(
    r"\bno\s+longer\b(?!\s+than)|"
    r"\b(?:last|this|previous|next)\s+round\s+of\b|\bbefore\s+the\s+last\b|\bthis\s+round\b|"
    r"\b(?:an\s+hour|a\s+day|a\s+week|minutes|hours|days|weeks)\s+(?:earlier|ago)\b|"
    r"\b(?:it|they|this|that|which|edgelm)\s+now\s+(?:\w+s|is|are|has|have)\b|"
    r"\b(?:is|are|has|have)\s+now\b|"
    r"\bpreviously\b|\buntil\s+recently\b|\banymore\b|\bas\s+before\b|\bthan\s+before\b|"
    r"\bdid\s+before\b|"
    r"\bthe\s+earlier\s+(?:\w+\s+)?(?:path|code|version|kernels?|build|layout|format)\b|"
    r"\bsince\s+(?:the|this|that)\s+(?:change|commit|release|round|rewrite)\b",
    re.IGNORECASE,
)
# "used to" tells a story unless it is the passive "is used to compute".
USED_TO = re.compile(r"\b(\w+)\s+used\s+to\b", re.IGNORECASE)
PASSIVE = {"is", "are", "be", "was", "were", "been", "being"}
# A measured speed, or a ratio with two decimals: figures that live in docs/performance.md.
FIGURE = re.compile(
    r"\b\d[\d,]*(?:\.\d+)?\s?(?:tok/s|tokens/s|texts/s|req/s|requests/s|GB/s|GFLOP/s)|"
    r"\b\d+\.\d\d\s?×"
)


def doc_hits(text: str, check_figures: bool) -> tuple[set[int], set[int]]:
    """The line numbers of a doc's story phrases and of its figures, found across line breaks
    (each newline read as a space, so that offsets stay those of the text)."""
    flat = text.replace("\n", " ")
    line_of = lambda offset: text.count("\n", 0, offset) + 1  # noqa: E731
    story = {line_of(m.start()) for m in DOC_STORY.finditer(flat)}
    story |= {
        line_of(m.start()) for m in USED_TO.finditer(flat) if m.group(1).lower() not in PASSIVE
    }
    for n, line in enumerate(text.splitlines(), 1):
        if HASH.search(line) or STORY.search(line):
            story.add(n)
    figures = {line_of(m.start()) for m in FIGURE.finditer(flat)} if check_figures else set()
    return story, figures


def comment_of(line: str) -> str:
    """The comment part of a Rust line (`//`, `///`, `//!`), or '' (a string's `//` aside)."""
    for m in re.finditer("//", line):
        if line[: m.start()].count('"') % 2 == 0:
            return line[m.start():]
    return ""


def main() -> int:
    story, figures = [], []
    texts = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    for path in texts:
        text = path.read_text()
        lines = text.splitlines()
        story_lines, figure_lines = doc_hits(text, path != PERFORMANCE)
        where = lambda n: f"{path.relative_to(ROOT)}:{n}: {lines[n - 1].strip()}"  # noqa: E731
        story += [where(n) for n in sorted(story_lines)]
        figures += [where(n) for n in sorted(figure_lines)]
    for path in sorted((ROOT / "src").rglob("*.rs")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            c = comment_of(line)
            if c and (HASH.search(c) or STORY.search(c)):
                story.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    if story:
        print("check-docs: history belongs in CHANGELOG.md, not in docs or comments:", file=sys.stderr)
        print("\n".join("  " + f for f in story), file=sys.stderr)
    if figures:
        print("check-docs: measured figures belong in docs/performance.md (link to it):",
              file=sys.stderr)
        print("\n".join("  " + f for f in figures), file=sys.stderr)
    if story or figures:
        return 1
    print(f"check-docs: {len(texts)} docs and the comments under src/ state what is true now; "
          "measured figures stand in docs/performance.md alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
