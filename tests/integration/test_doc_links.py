#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The user documentation (README.md and docs/**/*.md) stands on its own in a clone: every
Markdown link to a file names a file of the repository (never a path outside it, an
absolute path or a file:// URL), every #anchor names a heading of its target, and no page
cites a document that does not ship ("SPEC §N", ../shared/) or an issue number."""
import os
import re
import subprocess
import sys
import unicodedata
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import DIVERGE_BIN, SOURCE_DIR, run_tests  # noqa: E402

INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
FENCE = re.compile(r"^(```|~~~)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def doc_files():
    out = [os.path.join(SOURCE_DIR, "README.md")]
    for root, _dirs, files in os.walk(os.path.join(SOURCE_DIR, "docs")):
        out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".md")]
    return out


def prose(text):
    """TEXT without fenced code blocks and inline code spans (links there are not links)."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else re.sub(r"`[^`\n]*`", "``", line))
    return "\n".join(lines)


def slug(heading):
    """GitHub's anchor for a heading: lower case, inline markup and punctuation dropped
    (letters, digits, '-', '_' and spaces kept), spaces to '-'."""
    h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    h = h.replace("`", "").strip().lower()
    kept = []
    for ch in h:
        cat = unicodedata.category(ch)
        if ch in "-_ " or cat[0] in "LN":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    seen, out = {}, set()
    for line in prose_keep_code(text).split("\n"):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else "%s-%d" % (s, n))
    return out


def prose_keep_code(text):
    """TEXT without fenced blocks (headings keep their code spans: GitHub slugs their text)."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else line)
    return "\n".join(lines)


def links(path):
    with open(path, encoding="utf-8") as f:
        text = prose(f.read())
    for m in INLINE.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1)
    for m in REFDEF.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1)


def problem(src, target):
    """What is wrong with the link TARGET found in SRC, or None."""
    if target.startswith(("http://", "https://", "mailto:")):
        return None  # a web page, not a file of the repository
    if SCHEME.match(target) or target.startswith("/"):
        return "not a relative link to a file of the repository"
    path, _, anchor = target.partition("#")
    path = urllib.parse.unquote(path)
    dest = os.path.normpath(os.path.join(os.path.dirname(src), path)) if path else src
    root = os.path.realpath(SOURCE_DIR)
    if os.path.commonpath([os.path.realpath(dest), root]) != root:
        return "points outside the repository"
    if not os.path.exists(dest):
        return "no such file in the repository"
    if anchor and dest.endswith(".md") and anchor.lower() not in anchors(dest):
        return "no heading #%s in %s" % (anchor, os.path.relpath(dest, SOURCE_DIR))
    return None


def test_problem_finds_bad_links():
    readme = os.path.join(SOURCE_DIR, "README.md")
    assert problem(readme, "../shared/SPEC.md") == "points outside the repository"
    assert problem(readme, "docs/nope.md") == "no such file in the repository"
    assert problem(readme, "/etc/passwd") is not None
    assert problem(readme, "file:///etc/passwd") is not None
    assert problem(readme, "docs/architecture.md") is None
    assert problem(readme, "https://example.com/x") is None
    assert problem(readme, "#dashboard") is None
    assert problem(readme, "#no-such-heading").startswith("no heading")
    assert slug("Metering from your agent (Python, Node)") == "metering-from-your-agent-python-node"
    assert slug("The agent runner (`diverge-agent-runner`)") == "the-agent-runner-diverge-agent-runner"
    assert slug("Live updates: `GET /api/v1/events`") == "live-updates-get-apiv1events"


def test_every_link_names_a_file_of_the_repository():
    bad, count = [], 0
    for src in doc_files():
        for line, target in links(src):
            count += 1
            why = problem(src, target)
            if why:
                bad.append("%s:%d: %s: %s" % (os.path.relpath(src, SOURCE_DIR), line, target, why))
    assert count > 10, "found only %d links: is the parser broken?" % count
    assert not bad, "broken documentation links:\n  " + "\n  ".join(bad)


def test_no_citation_of_documents_that_do_not_ship():
    pat = re.compile(r"SPEC(?:\.md)?\s*§|SPEC section \d|\.\./shared/|KUBECTL-PROTOCOL|"
                     r"\bARCHITECTURE\.md|\bSTYLE\.md|\b[Ii]ssue #?\d+|README-runner")
    bad = []
    for src in doc_files():
        with open(src, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                for m in pat.finditer(line):
                    bad.append("%s:%d: %s" % (os.path.relpath(src, SOURCE_DIR), n, m.group(0)))
    assert not bad, "user documentation cites what a clone does not hold:\n  " + "\n  ".join(bad)


def test_every_serve_flag_has_a_row_in_the_configuration_reference():
    """docs/configuration.md is the one full list of flags (the README shows the common
    ones): each flag `diverge serve --help` names starts a row of its tables."""
    out = subprocess.run([DIVERGE_BIN, "serve", "--help"], capture_output=True, text=True,
                         timeout=30)
    flags = re.findall(r"^  (--[a-z0-9-]+)\s", out.stdout + out.stderr, re.M)
    assert len(flags) > 20, "found only %d flags in serve --help: is the parser broken?" % len(flags)
    with open(os.path.join(SOURCE_DIR, "docs", "configuration.md"), encoding="utf-8") as f:
        rows = [line for line in f if line.startswith("| `--")]
    missing = [fl for fl in flags if not any(re.search(r"`%s[` =]" % re.escape(fl), r.split(" | ")[0])
                                             for r in rows)]
    assert not missing, "flags of serve --help without a row in docs/configuration.md: %s" % missing


if __name__ == "__main__":
    run_tests([test_problem_finds_bad_links, test_every_link_names_a_file_of_the_repository,
               test_no_citation_of_documents_that_do_not_ship,
               test_every_serve_flag_has_a_row_in_the_configuration_reference])
