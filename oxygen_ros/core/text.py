"""Text from the outside world made safe for the tokenizer and for log lines."""

from __future__ import annotations

import unicodedata


def clean_text(text: str) -> str:
    """Tabs and newlines become spaces, other control characters (category Cc) are
    removed, and anything that is not valid UTF-8 (lone surrogates) is replaced."""
    out = []
    for ch in text:
        if ch in "\t\n\r\v\f":
            out.append(" ")
        elif unicodedata.category(ch) != "Cc":
            out.append(ch)
    return "".join(out).encode("utf-8", "replace").decode("utf-8")
