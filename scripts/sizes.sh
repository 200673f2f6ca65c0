#!/usr/bin/env bash
# Lists what is over the sizes the product keeps to (issue #47): a file over
# 700 lines, and a function over 120 lines outside the tests, in the product
# crates' sources. Prints one line each and how many; exits 1 when there is
# any, 0 when there is none.
#
#   scripts/sizes.sh [DIR...]   (default: crates/cascade-guard/src crates/cascade-guard-policy/src)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- crates/cascade-guard/src crates/cascade-guard-policy/src
for dir in "$@"; do
  [ -d "$dir" ] || { echo "sizes.sh: no directory $dir" >&2; exit 2; }
done

find "$@" -name '*.rs' | sort | python3 -c '
import re, sys

MAX_FILE, MAX_FN = 700, 120
FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")

def code_only(text):
    """The text with comments, strings and chars blanked (newlines kept), so
    that braces count as code."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j): depth, j = depth + 1, j + 2
                elif text.startswith("*/", j): depth, j = depth - 1, j + 2
                else: j += 1
            out.append("\n" * text.count("\n", i, j)); i = j
            continue
        m = re.match(r"b?r(#*)\"", text[i:i + 260])
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find("\"" + m.group(1), i + m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append("\n" * text.count("\n", i, end)); i = end
            continue
        if c == "\"":
            j = i + 1
            while j < n and text[j] != "\"":
                j += 2 if text[j] == "\\" else 1
            out.append("\n" * text.count("\n", i, j + 1)); i = j + 1
            continue
        m = re.match(r"'\''(\\.[^'\'']*|[^\\'\''])'\''", text[i:i + 12])
        if c == "'\''" and m:
            out.append(" "); i += m.end()
            continue
        out.append(c); i += 1
    return "".join(out)

found = 0
for path in (l.strip() for l in sys.stdin if l.strip()):
    text = open(path, encoding="utf-8").read()
    lines = text.count("\n")
    if lines > MAX_FILE:
        print(f"file {path}: {lines} lines (over {MAX_FILE})")
        found += 1
    # A module of its own named tests.rs (`#[cfg(test)] mod tests;`) is
    # test code throughout: its length counts, its functions do not.
    if path.rsplit("/", 1)[-1] == "tests.rs":
        continue
    code = code_only(text).split("\n")
    depth, test_depth, pending_test, opened = 0, None, False, []
    for no, line in enumerate(code, 1):
        stripped = line.strip()
        if stripped.startswith("#[cfg(test)]"):
            pending_test = True
        m = FN.match(line)
        if m and test_depth is None and not pending_test and "{" in line[m.end():] + "".join(code[no:no + 12]).split(";")[0]:
            opened.append((m.group(6), no, depth))
        for ch in line:
            if ch == "{":
                if pending_test and test_depth is None:
                    test_depth = depth
                pending_test = False
                depth += 1
            elif ch == "}":
                depth -= 1
                if test_depth is not None and depth == test_depth:
                    test_depth = None
                if opened and depth == opened[-1][2]:
                    name, start, _ = opened.pop()
                    length = no - start + 1
                    if length > MAX_FN:
                        print(f"function {path}:{start} {name}: {length} lines (over {MAX_FN})")
                        found += 1
        if stripped.endswith(";") and pending_test and "{" not in stripped:
            pending_test = False
print(f"sizes: {found} over (files over {MAX_FILE} lines, functions over {MAX_FN} outside tests)")
sys.exit(1 if found else 0)
'
