#!/usr/bin/env python3
"""Fails when a module under src/ imports one above it in the layer order docs/layers.md
writes down (an import may only point down the list; modules on one line are peers and may not
import each other).

Each file belongs to its top-level module under src/ (src/kv/pages.rs is `kv`, src/config.rs is
`config`). Every `crate::x` path counts, in `use` lines, grouped `use crate::{x, y::z}` and
inline paths alike; in the binary's files (main, cli, commands) `edgelm::x` counts too. Comments
are skipped, so doc links do not count.

    scripts/check-layers.py [SRC_DIR]
"""
import pathlib
import re
import sys

# Top to bottom. An import from a layer to a lower one is allowed; to its own line (other than
# itself) or a higher one is not.
LAYERS = [
    {"main", "cli", "commands"},
    {"server"},
    {"config"},
    {"engine"},
    {"grammar"},
    {"model"},
    {"backend"},
    {"kv", "tokenizer"},
    {"gguf"},
    {"quant"},
]
# Leaves anyone may use; they import nothing of the crate.
LEAVES = {"systemd", "cpu_features"}
# The crate roots: they declare the modules and belong to no layer.
ROOTS = {"lib"}

RANK = {module: rank for rank, line in enumerate(LAYERS) for module in line}

PATH = re.compile(r"\b(crate|edgelm)::(\{|[a-z_][a-z0-9_]*)")


def strip_comments(text):
    """The source with `//` comments and `/* */` blocks blanked (line numbers kept). String
    literals are left alone; a `crate::` inside one is rare enough to fix by hand."""
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return "\n".join(re.sub(r"//.*", "", line) for line in text.split("\n"))


def group_heads(text, start):
    """The first path segment of each item of the `{...}` group opening at `start`."""
    depth, item, heads = 0, "", []
    for ch in text[start:]:
        if ch == "{":
            depth += 1
            if depth == 1:
                continue
        elif ch == "}":
            depth -= 1
            if depth == 0:
                heads.append(item)
                break
        if depth == 1 and ch == ",":
            heads.append(item)
            item = ""
        elif depth >= 1:
            item += ch
    return [re.split(r"::|\s|\{", h.strip(), maxsplit=1)[0] for h in heads if h.strip()]


def imports(path):
    """(line number, imported top-level module) for each crate path in the file."""
    text = strip_comments(path.read_text())
    for m in PATH.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        if m.group(2) == "{":
            for head in group_heads(text, m.start(2)):
                yield line, m.group(1), head
        else:
            yield line, m.group(1), m.group(2)


def main():
    src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "src")
    binary = LAYERS[0]
    problems = []
    for path in sorted(src.rglob("*.rs")):
        module = path.relative_to(src).parts[0].removesuffix(".rs")
        if module in ROOTS:
            continue
        if module not in RANK and module not in LEAVES:
            problems.append(f"{path}: module `{module}` is in no layer (add it to {__file__} "
                            "and docs/layers.md)")
            continue
        for line, root, target in imports(path):
            # `crate::` in the binary names its own modules; `edgelm::` elsewhere is a doc test.
            if root == "edgelm" and module not in binary:
                continue
            if target in ("self", "super") or target == module:
                continue
            if module in LEAVES:
                problems.append(f"{path}:{line}: leaf `{module}` imports `{target}`")
            elif target in LEAVES:
                continue
            elif target not in RANK:
                if target not in ROOTS:
                    problems.append(f"{path}:{line}: `{target}` is in no layer")
            elif RANK[target] <= RANK[module] and not {module, target} <= binary:
                where = "a peer" if RANK[target] == RANK[module] else "up"
                problems.append(f"{path}:{line}: `{module}` imports `{target}` ({where})")
    for p in problems:
        print(p)
    if problems:
        print(f"check-layers: {len(problems)} import(s) break the layer order "
              "(docs/layers.md)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
