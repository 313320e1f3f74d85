#!/usr/bin/env python3
"""Fails when a function under src/ is longer than 80 lines, counted from its `fn` line to its
closing brace, and lists the longest ones either way.

Test code does not count: `#[test]` functions, items under `#[cfg(test)]` (inline `mod tests
{ ... }` blocks and the files of `#[cfg(test)] mod x;`, found by walking the module tree from
src/lib.rs and src/main.rs; a file outside that tree counts as code).

Macros count too. Each function a `macro_rules!` transcriber writes is measured like any other
(the SIMD kernels are generated that way, one expansion per instruction set): its name is the
one written, `$name` where a metavariable gives it, and a body given by a metavariable (`fn
body(...) $body`) counts as the lines of its signature. A `macro_rules!` that writes no function
(and stands outside one) is measured as one unit, from its `macro_rules!` line to its closing
bracket, named `name!`. Functions in a macro's matchers are patterns, not functions.

Braces are matched on the source with its comments, strings, raw strings (`r#"..."#`) and char
literals blanked out, so a `{` in a literal or a comment does not count; `'a` lifetimes and loop
labels are told apart from char literals.

    scripts/check-fn-length.py [SRC_DIR]
"""
import pathlib
import re
import sys

LIMIT = 80
SHOWN = 15

IDENT = re.compile(r"[A-Za-z0-9_]")
FN = re.compile(r"\bfn\s+(r#)?(\$?[A-Za-z_][A-Za-z0-9_]*)")
MACRO_RULES = re.compile(r"\bmacro_rules!\s*([A-Za-z_][A-Za-z0-9_]*)\s*")
METAVAR = re.compile(r"\$[A-Za-z_][A-Za-z0-9_]*")
MOD_DECL = re.compile(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*([;{])")
TEST_ATTR = re.compile(r"#\[\s*(test|cfg\s*\(\s*test\s*\))\s*\]")
INNER_CFG_TEST = re.compile(r"#!\[\s*cfg\s*\(\s*test\s*\)\s*\]")


def blank(text, start, end):
    """`text[start:end]` with every character but newlines made a space."""
    return re.sub(r"[^\n]", " ", text[start:end])


def mask(text):
    """The source with comments, string, raw string and char literals blanked (same length,
    newlines kept), so that what is left is code whose brackets can be counted."""
    out = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if ch == "/" and nxt == "/":
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif ch == "/" and nxt == "*":
            end = block_comment_end(text, i)
        elif ch in "rbc" and (i == 0 or not IDENT.match(text[i - 1])):
            end = prefixed_literal_end(text, i)
            if end is None:
                out.append(ch)
                i += 1
                continue
        elif ch == '"':
            end = string_end(text, i + 1)
        elif ch == "'":
            end = char_end(text, i)
            if end is None:  # a lifetime or a loop label
                out.append(ch)
                i += 1
                continue
        else:
            out.append(ch)
            i += 1
            continue
        out.append(blank(text, i, end))
        i = end
    return "".join(out)


def block_comment_end(text, i):
    """The end of the `/* */` comment opening at `i`; Rust's block comments nest."""
    depth, j = 0, i
    while j < len(text):
        pair = text[j : j + 2]
        if pair == "/*":
            depth, j = depth + 1, j + 2
        elif pair == "*/":
            depth, j = depth - 1, j + 2
            if depth == 0:
                return j
        else:
            j += 1
    return len(text)


def string_end(text, j):
    """The end of a `"` string whose contents start at `j` (escapes skipped)."""
    while j < len(text):
        if text[j] == "\\":
            j += 2
        elif text[j] == '"':
            return j + 1
        else:
            j += 1
    return len(text)


def prefixed_literal_end(text, i):
    """The end of a `b"..."`, `c"..."`, `b'.'` or raw (`r"..."`, `br#"..."#`) literal starting at
    `i`, or None when the letter there starts an identifier instead."""
    j = i
    if text[j] in "bc" and text[j + 1 : j + 2] in ("r", '"', "'"):
        j += 1
    if text[j] == "r":
        hashes = 0
        k = j + 1
        while k < len(text) and text[k] == "#":
            hashes, k = hashes + 1, k + 1
        if k >= len(text) or text[k] != '"':
            return None
        close = '"' + "#" * hashes
        end = text.find(close, k + 1)
        return len(text) if end < 0 else end + len(close)
    if j == i:
        return None
    if text[j] == '"':
        return string_end(text, j + 1)
    return char_end(text, j)


def char_end(text, i):
    """The end of the char literal opening at `i`, or None when the quote starts a lifetime or a
    label (`'a` with no closing quote right after one character)."""
    if text[i + 1 : i + 2] == "\\":
        j = i + 3  # past the backslash and the character it escapes
        while j < len(text) and text[j] != "'":
            j += 1
        return j + 1
    if text[i + 2 : i + 3] == "'":
        return i + 3
    return None


def matching_close(code, open_at):
    """The index just past the bracket that closes the one at `open_at`."""
    pairs = {"{": "}", "(": ")", "[": "]"}
    opener, closer = code[open_at], pairs[code[open_at]]
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == opener:
            depth += 1
        elif code[j] == closer:
            depth -= 1
            if depth == 0:
                return j + 1
    return len(code)


def item_end(code, start, in_macro=False):
    """The end of the item starting at `start`: past its first top-level `{...}` block, or its
    `;` when it has none (`mod x;`, a trait method without a body). In a macro transcriber, a
    function's body may be a metavariable (`fn body(...) $body`): the item ends after it."""
    depth = 0
    after_group = False
    j = start
    while j < len(code):
        ch = code[j]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            after_group = depth == 0
            j += 1
            continue
        elif depth == 0 and ch == "{":
            return matching_close(code, j)
        elif depth == 0 and ch == ";":
            return j + 1
        elif in_macro and depth == 0 and ch == "$" and after_group:
            var = METAVAR.match(code, j)
            if var:
                return var.end()
        if not ch.isspace() and ch not in "?":
            after_group = False
        j += 1
    return len(code)


def test_ranges(code):
    """The spans of the items carrying `#[test]` or `#[cfg(test)]`."""
    spans = []
    for attr in TEST_ATTR.finditer(code):
        spans.append((attr.start(), item_end(code, attr.end())))
    return spans


def macro_rules(code):
    """(name, start, end, transcriber spans) of each `macro_rules!` definition: its rules are
    `(matcher) => {transcriber}` pairs, separated by `;`."""
    found = []
    for m in MACRO_RULES.finditer(code):
        if m.end() >= len(code) or code[m.end()] not in "{([":
            continue
        end = matching_close(code, m.end())
        transcribers = []
        j = m.end() + 1
        while j < end - 1:
            if code[j] not in "{([":
                j += 1
                continue
            matcher_end = matching_close(code, j)
            arrow = code.find("=>", matcher_end, end)
            k = arrow + 2
            while k < end and code[k].isspace():
                k += 1
            if arrow < 0 or k >= end - 1 or code[k] not in "{([":
                break
            body_end = matching_close(code, k)
            transcribers.append((k, body_end))
            j = body_end
        found.append((m.group(1), m.start(), end, transcribers))
    return found


def inside(pos, spans):
    return any(start <= pos < end for start, end in spans)


def line_of(code, pos):
    return code.count("\n", 0, pos) + 1


def functions(code, macros):
    """(name, first line, line count, start, end) of each function with a body, those a macro's
    transcriber writes included; a `fn` in a macro's matcher is a pattern, and is left out."""
    matchers = [
        (start, end)
        for _, start, end, transcribers in macros
        for start, end in gaps((start, end), transcribers)
    ]
    transcribed = [span for *_, transcribers in macros for span in transcribers]
    found = []
    for m in FN.finditer(code):
        in_macro = inside(m.start(), transcribed)
        if inside(m.start(), matchers) and not in_macro:
            continue
        end = item_end(code, m.end(), in_macro)
        if code[end - 1] != "}" and not (in_macro and code[end - 1] not in ";"):
            continue
        first = line_of(code, m.start())
        length = line_of(code, end - 1) - first + 1
        found.append((m.group(2), first, length, m.start(), end))
    return found


def gaps(span, inner):
    """The parts of `span` outside the spans `inner` (sorted, within it)."""
    out, at = [], span[0]
    for start, end in inner:
        out.append((at, start))
        at = end
    out.append((at, span[1]))
    return out


def macro_units(code, macros, fns):
    """(name!, first line, line count, start) of each `macro_rules!` that writes no function
    and stands outside every function."""
    units = []
    for name, start, end, _ in macros:
        writes_fn = any(start <= f[3] < end for f in fns)
        in_fn = any(f[3] < start < f[4] for f in fns)
        if writes_fn or in_fn:
            continue
        first = line_of(code, start)
        units.append((f"{name}!", first, line_of(code, end - 1) - first + 1, start))
    return units


def child_file(path, inline_mods, name):
    """The file of `mod name;` declared in `path` inside the inline modules `inline_mods`."""
    base = path.parent
    if path.name not in ("mod.rs", "lib.rs", "main.rs"):
        base = base / path.stem
    for mod in inline_mods:
        base = base / mod
    for candidate in (base / f"{name}.rs", base / name / "mod.rs"):
        if candidate.exists():
            return candidate
    return None


def module_files(path, code, tests):
    """(file, is test code) of each `mod x;` that `path` declares."""
    children = []
    for m in MOD_DECL.finditer(code):
        if m.group(2) != ";":
            continue
        inline = [
            d.group(1)
            for d in MOD_DECL.finditer(code, 0, m.start())
            if d.group(2) == "{" and m.start() < matching_close(code, d.end() - 1)
        ]
        file = child_file(path, inline, m.group(1))
        if file is not None:
            children.append((file, inside(m.start(), tests)))
    return children


def scan(src):
    """(file, name, first line, line count) of every non-test function, and of every
    `macro_rules!` that writes none."""
    roots = [src / "lib.rs", src / "main.rs"]
    queue = [(root, False) for root in roots if root.exists()]
    seen, rows = set(), []
    while True:
        if not queue:
            # A file no module declaration reaches is not test code either.
            rest = sorted(set(src.rglob("*.rs")) - seen)
            if not rest:
                break
            queue.append((rest[0], False))
        path, is_test = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        code = mask(path.read_text())
        is_test = is_test or bool(INNER_CFG_TEST.search(code))
        tests = test_ranges(code)
        queue.extend((file, is_test or test) for file, test in module_files(path, code, tests))
        if is_test:
            continue
        macros = macro_rules(code)
        fns = functions(code, macros)
        for name, first, length, start, *_ in fns + macro_units(code, macros, fns):
            if not inside(start, tests):
                rows.append((path, name, first, length))
    return rows


def main():
    src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "src")
    rows = sorted(scan(src), key=lambda row: -row[3])
    print(f"check-fn-length: the {SHOWN} longest functions under {src}/:")
    for path, name, first, length in rows[:SHOWN]:
        print(f"  {length:4} lines  {path}:{first}  {name}")
    over = [row for row in rows if row[3] > LIMIT]
    if over:
        print(f"check-fn-length: {len(over)} function(s) over {LIMIT} lines; split them:")
        for path, name, first, length in over:
            print(f"  {path}:{first}  {name} ({length} lines)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
