#!/usr/bin/env python3
"""Fails on a code comment or a doc that names a repository path which does not exist.

What is read: the comments of the tracked sources under agent/ cni/ loader/ maps/ bpf/ bench/
tests/ (C, C++, BPF C, Go and JavaScript `//` and `/* */` comments; shell, Python, CMake and
fuzzing-dictionary `#` comments), and the whole text of docs/*.md, README.md and bench/README.md.

What counts as a path: a token that starts with one of the repository's top-level folders (those
`git ls-files` shows, e.g. `agent/`, `tests/`, `docs/`) followed by at least one more component,
made of the characters file names here use (letters, digits, `_`, `-`, `.`, `+`), and not itself
the tail of a longer path or an address (`github.com/cilium/cilium/bpf/lib`, `$BUILD/bench/x`
are not read). A trailing `.`, `,` or `:` ends the sentence, not the name. A token that goes on
into a pattern is checked as one: `*` as a glob, `{h,cc}` expanded; a placeholder (`<module>`,
`$NAME`, or a capital letter standing for a name: `X_test.sh`, `svc-NNNNN`) cuts the check at the
last folder before it. A name without an extension is a module and names its files
(`agent/conntrack/gc`: gc.h, gc.cc). The docs' relative Markdown links (`[lab](lab.md)`) are
paths too, relative to the page.

Nothing is allow-listed: every path named must exist in the work tree, except one that the
repository's .gitignore names (made by the build or by `make deps`, e.g. tests/helm/node_modules),
which is counted and printed as not checked.

usage: named_paths_test.py SOURCE_DIR
"""

import glob
import os
import re
import subprocess
import sys

COMMENTED = ("agent", "cni", "loader", "maps", "bpf", "bench", "tests")
SLASH_COMMENTS = (".c", ".h", ".cc", ".cpp", ".go", ".mjs", ".js")
HASH_COMMENTS = (".sh", ".py", ".cmake", ".dict", ".yaml", ".yml", ".txt", ".in")
HASH_NAMES = ("CMakeLists.txt", "Makefile")

NAME = r"[A-Za-z0-9_+.-]+"


def tracked_files(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                         stdout=subprocess.PIPE).stdout.decode()
    return [p for p in out.split("\0") if p]


def slash_comments(text):
    """Yields (line number, comment text) of C-like source, skipping string and char literals."""
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            yield line, text[i + 2:end]
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end
            body = text[i + 2:end]
            for k, part in enumerate(body.split("\n")):
                yield line + k, part
            line += body.count("\n")
            i = end + 2
        elif c in "\"'`":
            # A raw string R"d(...)d" runs to its own delimiter.
            raw = re.match(r'R"([^(\s]*)\(', text[i - 1:i + 20]) if c == '"' and i else None
            if raw:
                end = text.find(")" + raw.group(1) + '"', i)
                end = n if end < 0 else end + len(raw.group(1)) + 2
            else:
                end = i + 1
                while end < n and text[end] != c and text[end] != "\n":
                    end += 2 if text[end] == "\\" else 1
                end += 1
            line += text.count("\n", i, end)
            i = end
        else:
            i += 1


def hash_comments(text):
    """Yields (line number, comment text): a `#` at the start of a line or after a blank, outside
    quotes (a shell `$#`, `${#x}` or a `#` inside a string is not a comment)."""
    for number, raw in enumerate(text.split("\n"), 1):
        quote = None
        for k, c in enumerate(raw):
            if quote:
                if c == quote:
                    quote = None
                elif c == "\\":
                    continue
            elif c in "\"'":
                quote = c
            elif c == "#" and (k == 0 or raw[k - 1] in " \t"):
                yield number, raw[k + 1:]
                break


def candidates(text, roots):
    """Yields (the pattern to check, as written) for every path-shaped token of text."""
    token = re.compile(r"(?<![\w/.$-])(?:\./)?((?:%s)(?:/%s)+)(/?)" %
                       ("|".join(map(re.escape, roots)), NAME))
    for m in token.finditer(text):
        path, slash = m.group(1), m.group(2)
        rest = text[m.end():]
        written = m.group(0)
        if slash and rest[:1] and rest[0] in "*{":
            # A glob or brace pattern after a folder: tests/e2e/*_test.sh.
            tail = re.match(r"[A-Za-z0-9_+.*{},-]*", rest).group(0)
            yield path + "/" + tail, written + tail
            continue
        if slash and rest[:1] and rest[0] in "<$[":
            yield path, written  # a placeholder after a folder: check the folder
            continue
        if rest[:1] in ("*", "{") and not slash:
            tail = re.match(r"[A-Za-z0-9_+.*{},-]*", rest).group(0)
            yield path + tail, written + tail
            continue
        if rest[:1] in ("<", "$") and not slash:
            # A placeholder inside the last component (tests/<dir>/foo_$X): check its folder.
            yield path.rsplit("/", 1)[0], written
            continue
        path = path.rstrip(".,:;")
        parts = path.split("/")
        for k, part in enumerate(parts):
            if any(re.fullmatch(r"([A-Z])\1*", w) for w in re.split(r"[-_.]", part)):
                path = "/".join(parts[:k])  # a capital placeholder: check the folder before it
                break
        yield path, written


def expand(pattern):
    """Brace expansion ({a,b}) and then glob; returns the list of paths the pattern can mean."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m:
        out = []
        for alt in m.group(1).split(","):
            out += expand(pattern[:m.start()] + alt + pattern[m.end():])
        return out
    return [pattern]


def exists(root, pattern):
    for p in expand(pattern):
        p = os.path.join(root, p.rstrip(".,:;"))
        if "*" in p:
            if not glob.glob(p):
                return False
        elif not os.path.exists(p):
            # A module: agent/conntrack/gc names gc.h and gc.cc.
            if "." in os.path.basename(p) or not glob.glob(glob.escape(p) + ".*"):
                return False
    return True


def ignored(root, path):
    """Whether the repository's .gitignore names path (made by the build or by make deps)."""
    # As a file and as a folder: a pattern with a trailing / matches only a folder.
    return any(subprocess.run(["git", "-C", root, "check-ignore", "-q", "--no-index", p],
                              check=False).returncode == 0 for p in (path, path + "/"))


def markdown_links(text):
    """Yields (line number, target) of relative Markdown links: [text](target)."""
    for number, raw in enumerate(text.split("\n"), 1):
        for m in re.finditer(r"\]\(([^)\s]+)\)", raw):
            target = m.group(1).split("#", 1)[0]
            if target and not re.match(r"[a-z][a-z0-9+.-]*:", target):
                yield number, target


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = os.path.abspath(sys.argv[1])
    files = tracked_files(root)
    roots = sorted({f.split("/", 1)[0] for f in files
                    if "/" in f and not f.startswith(".")})
    if not roots:
        sys.exit("no tracked top-level folders under " + root)

    docs = [f for f in files
            if (f.startswith("docs/") and f.endswith(".md")) or f in ("README.md",
                                                                       "bench/README.md")]
    sources = [f for f in files if f.split("/", 1)[0] in COMMENTED and f not in docs]

    stale, unchecked, checked, scanned = [], [], 0, 0
    for rel in sorted(set(sources + docs)):
        path = os.path.join(root, rel)
        if not os.path.isfile(path):
            continue  # deleted in the work tree, not yet from the index
        base = os.path.basename(rel)
        if rel in docs:
            lines = lambda t: enumerate(t.split("\n"), 1)
        elif base.endswith(SLASH_COMMENTS):
            lines = slash_comments
        elif base.endswith(HASH_COMMENTS) or base in HASH_NAMES:
            lines = hash_comments
        else:
            continue  # data: corpora, fixtures, JSON
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            continue  # binary data
        scanned += 1
        for number, comment in lines(text):
            for pattern, written in candidates(comment, roots):
                checked += 1
                if exists(root, pattern):
                    continue
                if ignored(root, pattern):
                    unchecked.append(f"{rel}:{number}: {written}")
                else:
                    stale.append(f"{rel}:{number}: {written} (no {pattern})")
        if rel in docs:
            for number, target in markdown_links(text):
                checked += 1
                resolved = os.path.normpath(os.path.join(os.path.dirname(rel), target))
                if not os.path.exists(os.path.join(root, resolved)):
                    stale.append(f"{rel}:{number}: link {target} (no {resolved})")

    print(f"{scanned} files read, {checked} path names checked against {root}")
    if unchecked:
        print(f"{len(unchecked)} name a path .gitignore names (made by the build or make deps), "
              "not checked:")
        for u in unchecked:
            print("  " + u)
    if stale:
        print(f"{len(stale)} name a path that does not exist:")
        for s in stale:
            print("  " + s)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
