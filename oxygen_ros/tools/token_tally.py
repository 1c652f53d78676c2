"""What a subscriber of ``/oxygen/text`` can tell about the token stream it got.

:class:`TokenTally` takes the TextToken messages of started requests (request
id > 0), in the order they arrived, and keeps per request the tokens received
and the index it expects next. From these it counts two different faults:

* ``tokens_lost``: when a request ends, the tokens its last message says were
  sent (its index, plus one when the last message carries a token) that never
  arrived;
* ``index_gaps``: messages whose index is not the one after the message before
  (a message lost, repeated or out of order).

One lost token shows in both (a gap, and one token short at the end); they are
reported apart, never added. Only open requests are kept, so a long soak holds
no more than its running requests.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


class TokenTally:
    """Per-request counts of a TextToken stream (see the module doc)."""

    def __init__(self) -> None:
        self.open: dict[int, dict[str, Any]] = {}  # request id -> {tokens, next index}
        self.ends: Counter = Counter()  # finish reason -> requests ended
        self.started = 0
        self.tokens_received = 0
        self.tokens_lost = 0
        self.index_gaps = 0

    def add(self, request_id: int, index: int, token_id: int, done: bool, finish_reason: str) -> bool:
        """One message of request ``request_id`` (> 0); True when it ended the request."""
        if request_id <= 0:
            raise ValueError(f"request_id {request_id}: a started request's id is > 0")
        r = self.open.get(request_id)
        if r is None:
            r = self.open[request_id] = {"tokens": 0, "next": 0}
            self.started += 1
        if index != r["next"]:
            self.index_gaps += 1
        r["next"] = index + 1
        if token_id >= 0:
            r["tokens"] += 1
            self.tokens_received += 1
        if not done:
            return False
        sent = index + (1 if token_id >= 0 else 0)
        self.tokens_lost += max(0, sent - r["tokens"])
        self.ends[finish_reason] += 1
        del self.open[request_id]
        return True
