"""Every relative link of the project's Markdown pages (README, docs/, the data's
notes) leads somewhere: the file exists, and a ``#section`` names a heading of
the page it points at, slugged as GitHub slugs them. A reader who follows a
link from the README to the measurements in docs/ and back lands on the text."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_pages():
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "oxygen_ros").rglob("*.md"))]


def unfenced_lines(text):
    """The lines outside fenced code blocks."""
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield line


def prose(text):
    """The text outside code blocks (fenced, or indented four spaces), inline code taken out."""
    kept = [line for line in unfenced_lines(text) if not line.startswith("    ")]
    return re.sub(r"`[^`]*`", "", "\n".join(kept))


def slug(heading):
    """GitHub's anchor of a heading: lower case, inline code's backticks and
    punctuation dropped (hyphens and underscores kept), spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page):
    seen = {}
    found = set()
    for line in unfenced_lines(page.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            found.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return found


def links(page):
    for m in LINK.finditer(prose(page.read_text(encoding="utf-8"))):
        target = m.group(2) or m.group(3)
        if not re.match(r"[a-z]+:", target):
            yield target


def test_slug_follows_github():
    assert slug("Settings (`setting` parameter, `--settings` of `oxygen-bench`)") == (
        "settings-setting-parameter---settings-of-oxygen-bench")
    assert slug("Why, and the fix") == "why-and-the-fix"
    assert slug("The managed (lifecycle) inference node") == "the-managed-lifecycle-inference-node"


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading '#{anchor}' in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)} has broken links:\n" + "\n".join(broken)
