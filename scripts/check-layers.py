#!/usr/bin/env python3
"""Fails when a module under src/ imports one above it in the layer order docs/layers.md
writes down (an import may only point down the list; modules on one line are peers and may not
import each other); when, inside a module with an order of folders (`FOLDERS`), a file imports
from a folder above its own or from the module's root; when the files of a module in
`CIRCLE_FREE` import each other in a circle; or when a folder holds more than `MAX_FILES`
files.

Each file belongs to its top-level module under src/ (src/kv/pages.rs is `kv`, src/config.rs is
`config`). Every `crate::x` path counts, in `use` lines, grouped `use crate::{x, y::z}` and
inline paths alike; in the binary's files (main, cli, commands) `edgelm::x` counts too. Comments
are skipped, so doc links do not count.

Between files, `crate::`, `super::` and `self::` paths and paths through a module the file
declares (`mod x;` ... `use x::Y`) are resolved to the file that defines the module they name;
an item re-exported by a folder's `mod.rs` is an import of that `mod.rs`. Test code
(`#[cfg(test)]` and `#[test]` items) is left out of the file checks: a test may use whatever it
checks against.

    scripts/check-layers.py [SRC_DIR]
"""
import importlib.util
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
    {"chat"},
    {"grammar"},
    {"vision"},
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

# Inside these modules, the folders are layers too, top to bottom (a folder's subfolders belong
# to it): a file imports only from its own folder or one below, never from the module's root
# `mod.rs`, which only declares the folders and re-exports what the crate uses.
FOLDERS = {"server": ["http", "openai", "generate"]}
# Modules whose files must not import each other in a circle.
CIRCLE_FREE = {"server", "chat"}
# Files (`.rs`) one folder may hold.
MAX_FILES = 15

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


def load_fn_length():
    """scripts/check-fn-length.py as a module: its masking of literals and comments and its
    finding of test items serve here too."""
    path = pathlib.Path(__file__).with_name("check-fn-length.py")
    spec = importlib.util.spec_from_file_location("check_fn_length", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FN_LENGTH = load_fn_length()
IDENT_PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE = re.compile(r"\buse\s+([^;]*);")
CHILD_MOD = re.compile(r"\bmod\s+([a-z_][a-z0-9_]*)\s*;")


def without_tests(path):
    """The file's code with comments, literals and test items blanked."""
    code = FN_LENGTH.mask(path.read_text())
    for start, end in FN_LENGTH.test_ranges(code):
        code = code[:start] + FN_LENGTH.blank(code, start, end) + code[end:]
    return code


def module_of(path, src):
    """The module path of a file: src/server/http/mod.rs is ["server", "http"]."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "mod" else parts


def file_of(segments, src):
    """The file defining the longest prefix of `segments` that is a module, or None."""
    for n in range(len(segments), 0, -1):
        base = src.joinpath(*segments[:n])
        for candidate in (base.with_suffix(".rs"), base / "mod.rs"):
            if candidate.exists():
                return candidate
    return None


def expand(tree):
    """The paths of one `use` tree: `a::{b, c::{d, e}}` is a::b, a::c::d, a::c::e."""
    tree = re.sub(r"\s+", "", tree)
    brace = tree.find("{")
    if brace < 0:
        return [tree.split(" as ")[0]]
    head, body = tree[:brace], tree[brace + 1 : tree.rindex("}")]
    items, depth, item = [], 0, ""
    for ch in body:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
        else:
            item += ch
    items.append(item)
    return [head + path for item in items if item for path in expand(item)]


def file_imports(path, src):
    """The files of the crate that a file's code (tests left out) imports."""
    code = without_tests(path)
    here = module_of(path, src)
    children = set(CHILD_MOD.findall(code))
    paths = [p for m in USE.finditer(code) for p in expand(m.group(1))]
    paths += [m.group(1) + m.group(2) for m in IDENT_PATH.finditer(USE.sub("", code))]
    found = set()
    for p in paths:
        segments = [s for s in p.split("::") if s]
        if not segments:
            continue
        if segments[0] == "crate":
            target = segments[1:]
        elif segments[0] in ("super", "self"):
            target = list(here)
            while segments and segments[0] in ("super", "self"):
                if segments.pop(0) == "super":
                    target.pop()
            target += segments
        elif segments[0] in children:
            target = here + segments
        else:
            continue
        file = file_of(target, src)
        if file is not None and file != path:
            found.add(file)
    return found


def folder_problems(src, graph):
    """Imports that run up the folder order of a module in FOLDERS, or into its root."""
    problems = []
    for module, order in FOLDERS.items():
        root = src / module / "mod.rs"
        rank = {folder: r for r, folder in enumerate(order)}
        for path, targets in graph.items():
            parts = path.relative_to(src).parts
            if parts[0] != module or path == root:
                continue
            if len(parts) < 3 or parts[1] not in rank:
                problems.append(f"{path}: in no folder of `{module}` ({', '.join(order)})")
                continue
            for target in targets:
                tparts = target.relative_to(src).parts
                if tparts[0] != module:
                    continue
                if target == root:
                    problems.append(f"{path}: imports `{module}`'s root (mod.rs only re-exports)")
                elif len(tparts) >= 3 and rank.get(tparts[1], -1) < rank[parts[1]]:
                    problems.append(f"{path}: `{parts[1]}` imports `{tparts[1]}` ({target}), "
                                    "a folder above it")
    return problems


def circles(graph, module, src):
    """Each import circle (as a list of files) among the files of `module`."""
    nodes = [p for p in graph if p.relative_to(src).parts[0] == module]
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in graph or w.relative_to(src).parts[0] != module:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in nodes:
        if v not in index:
            visit(v)
    return found


def file_problems(src):
    """Folder order, import circles and folder sizes."""
    graph = {path: file_imports(path, src) for path in sorted(src.rglob("*.rs"))}
    problems = folder_problems(src, graph)
    for module in sorted(CIRCLE_FREE):
        for circle in circles(graph, module, src):
            problems.append("import circle: " + " -> ".join(str(p) for p in circle))
    for folder in sorted({p.parent for p in graph}):
        count = len(list(folder.glob("*.rs")))
        if count > MAX_FILES:
            problems.append(f"{folder}: {count} files (at most {MAX_FILES}; split it by concern)")
    return problems


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
    problems += file_problems(src)
    for p in problems:
        print(p)
    if problems:
        print(f"check-layers: {len(problems)} problem(s) with the layer order, the folders or "
              "import circles (docs/layers.md)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
