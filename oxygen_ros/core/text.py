"""Text from the outside world made safe for the tokenizer and for log lines."""

from __future__ import annotations

import unicodedata


#: what becomes a space: tabs and everything ``str.splitlines`` breaks a line at (U+0085, U+2028, ...)
SPACES = frozenset("\t" + "".join(ch for ch in map(chr, range(0x2030)) if len(f"a{ch}b".splitlines()) == 2))


def clean_text(text: str) -> str:
    """Tabs and line breaks (all that ``str.splitlines`` breaks at) become spaces, other
    control characters (category Cc) are removed, and anything that is not valid UTF-8
    (lone surrogates) is replaced."""
    out = []
    for ch in text:
        if ch in SPACES:
            out.append(" ")
        elif unicodedata.category(ch) != "Cc":
            out.append(ch)
    return "".join(out).encode("utf-8", "replace").decode("utf-8")


def clip(text: str, limit: int = 200) -> str:
    """``text`` for a log line: at most ``limit`` characters (and how many more)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"
