"""Language requests as resumable states σ = (slot K/V, tokens, done), and their manager.

A :class:`Request` keeps its K/V in one pool slot (prefix, optional question,
then every decoded token), its token buffer and its finish reason. The
:class:`RequestManager` offers Store / Retrieve / Update / Remove over the
active requests and decides admission: a request starts when fewer than
``max_active`` are running, otherwise waits in a bounded FIFO queue, and is
rejected (with the reason reported like any other finish) past the bound.
A running request is never evicted, and no decoded token is ever dropped.
"""

from __future__ import annotations

import enum
import itertools
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from .kv_pool import KVPool
from .observation import Observation
from .tokenizer import StreamDecoder, Tokenizer


class FinishReason(str, enum.Enum):
    EOS = "eos"
    LENGTH = "length"
    REJECTED = "rejected"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class TokenEvent:
    """One streamed token (or a finish without a token: ``token_id`` -1)."""

    request_id: int
    client_id: str
    frame_id: int
    index: int
    token_id: int
    piece: str
    done: bool
    finish_reason: str  # "" while running
    robot: str = ""  # the robot whose observation the request reads ("": the only one)
    # on the last event, in words: why, for a refusal or a cancel by the node; else a note
    # on how it was answered (a question cut to max_question_tokens); "" otherwise
    detail: str = ""


@dataclass
class Request:
    id: int
    frame_id: int  # the frame whose observation it reads
    max_tokens: int
    client_id: str = ""
    robot: str = ""  # the robot that asked (a question) or whose observation started it
    question_ids: list[int] = field(default_factory=list)
    observation: Observation | None = None  # kept only until its prefix is in a slot
    slot: int | None = None
    tokens: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    created: float = field(default_factory=time.perf_counter)
    finished: float | None = None
    note: str = ""  # said on its last token's event (e.g. that its question was cut)
    _stream: StreamDecoder | None = field(default=None, repr=False)
    _pieces: list[str] = field(default_factory=list, repr=False)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def pending_token(self) -> int:
        """The newest token: produced, not yet appended to the slot."""
        return self.tokens[-1]

    @property
    def text(self) -> str:
        return "".join(self._pieces)


class RequestManager:
    def __init__(self, pool: KVPool, tokenizer: Tokenizer, *, max_active: int, queue_limit: int):
        if max_active <= 0 or queue_limit < 0:
            raise ValueError(f"max_active must be > 0 and queue_limit >= 0, got {max_active}, {queue_limit}")
        self.pool = pool
        self.tokenizer = tokenizer
        self.max_active = max_active
        self.queue_limit = queue_limit
        self.active: dict[int, Request] = {}
        self.queue: deque[Request] = deque()
        self._ids = itertools.count(1)

    def new(self, frame_id: int, max_tokens: int, **kwargs) -> Request:
        return Request(id=next(self._ids), frame_id=frame_id, max_tokens=max_tokens, **kwargs)

    # ------------------------------------------------------------------ admission
    def admit(self, new: list[Request], free_places: int | None = None) -> tuple[list[Request], list[Request]]:
        """Decide who starts now: queued requests first (FIFO), then ``new``.

        Returns (starting, rejected). Starting requests must then get a slot
        and be stored; the rest of ``new`` wait in the queue. Rejected ones
        are already finished with reason ``rejected``.
        """
        places = self.max_active - len(self.active) if free_places is None else free_places
        starting, rejected = [], []
        while self.queue and places > 0:
            starting.append(self.queue.popleft())
            places -= 1
        for r in new:
            if places > 0 and not self.queue:
                starting.append(r)
                places -= 1
            elif len(self.queue) < self.queue_limit:
                self.queue.append(r)
            else:
                r.finish_reason, r.finished = FinishReason.REJECTED, time.perf_counter()
                r.observation = None
                rejected.append(r)
        return starting, rejected

    # ------------------------------------------------------------------ σ operations
    def store(self, request: Request, slot: int) -> None:
        """Make ``request`` active in ``slot`` (which already holds its prefix)."""
        if request.id in self.active:
            raise ValueError(f"request {request.id} is already active")
        if len(self.active) >= self.max_active:
            raise RuntimeError(f"store over max_active={self.max_active}")
        self.pool.assign(slot, request.id)
        request.slot = slot
        request.observation = None
        request._stream = StreamDecoder(self.tokenizer)
        self.active[request.id] = request

    def update(self, request_id: int, token: int, eos_id: int) -> TokenEvent:
        """Append one produced token; finish on EOS or at ``max_tokens``."""
        r = self.active[request_id]
        if r.done:
            raise ValueError(f"request {request_id} is already finished ({r.finish_reason.value})")
        r.tokens.append(token)
        piece = r._stream.push(token)
        if token == eos_id:
            r.finish_reason = FinishReason.EOS
        elif len(r.tokens) >= r.max_tokens:
            r.finish_reason = FinishReason.LENGTH
        if r.done:
            r.finished = time.perf_counter()
            piece += r._stream.flush()
        r._pieces.append(piece)
        return TokenEvent(r.id, r.client_id, r.frame_id, len(r.tokens) - 1, token, piece, r.done,
                          r.finish_reason.value if r.done else "", r.robot, r.note if r.done else "")

    def remove(self, request_id: int) -> Request:
        r = self.active.pop(request_id)
        if r.slot is not None:
            self.pool.release(r.slot)
            r.slot = None
        return r

    def cancel_all(self) -> list[TokenEvent]:
        """Finish every active and queued request with reason ``cancelled``."""
        return self.cancel(lambda r: True)

    def cancel_clients(self, client_ids, robot: str | None = None) -> list[TokenEvent]:
        """Finish the active and queued requests of ``client_ids`` (of ``robot`` only, unless
        None) with reason ``cancelled`` (their slots are free at once); clients with no such
        request are ignored."""
        client_ids = set(client_ids)
        return self.cancel(lambda r: r.client_id in client_ids and not r.done and robot in (None, r.robot))

    def cancel(self, which) -> list[TokenEvent]:
        """Finish the active and queued requests ``r`` with ``which(r)``: ``cancelled``."""
        events = []
        for r in [r for r in list(self.active.values()) + list(self.queue) if which(r)]:
            if r.id in self.active:
                self.remove(r.id)
            else:
                self.queue.remove(r)
            r.finish_reason, r.finished, r.observation = FinishReason.CANCELLED, time.perf_counter(), None
            events.append(finish_event(r))
        return events

    def running(self) -> Iterator[Request]:
        return (r for r in self.active.values() if not r.done)

    def moved(self, owner, dst: int) -> None:
        """The pool moved ``owner``'s slot to ``dst`` (wire it as the pool's ``on_move``)."""
        r = self.active.get(owner)
        if r is not None:
            r.slot = dst


def finish_event(r: Request, detail: str = "") -> TokenEvent:
    """The closing event of a request that finished without a new token (``detail``: why)."""
    return TokenEvent(r.id, r.client_id, r.frame_id, len(r.tokens), -1, "", True, r.finish_reason.value, r.robot,
                      detail)
