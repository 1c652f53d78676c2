"""One frame under each setting of the OxyGen paper (names as in its public harness).

* ``baseline``  - isolated tasks, one after the other: for each observation a
  prefill and the denoising of its action chunk; then, for each new language
  request, its own prefill and all of its decoding (batch 1).
* ``parallel``  - the same two isolated tasks, run concurrently (a thread for
  actions, one for language; torch releases the GIL inside its kernels).
* ``shared_kv`` - one prefill per observation feeds both experts; the frame's
  new requests then decode to completion (no batching across frames).
* ``oxygen``    - shared prefill plus cross-frame continuous batching: every
  active request (new and earlier) advances ``k`` tokens per frame in one
  batched forward per step; requests live across frames in their slots.

Every setting uses the engine's primitives over the same pool; they differ
only in when those run and over which slots. No setting copies K/V. The
action chunks (one per observation, in their order) and the tokens reach the
frame's result through the engine's primitives, as each is made: a frame that
fails after its actions were denoised still has them.

Threads: ``parallel`` runs the language task on a second thread. The two
threads share only the pool, whose bookkeeping is locked, and the engine's
frame result, whose phase timings are added under the engine's lock; each
thread holds its own slots and the requests belong to the language thread
alone. An exception on the language thread is raised again on the caller's
thread after both tasks have stopped.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from .kv_pool import SCRATCH, KVPool

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .observation import Observation
    from .requests import Request


class Engine(Protocol):
    """What a setting may use of the engine: its pool, its model's device and five primitives."""

    pool: KVPool
    model: "torch.nn.Module"

    def prefill(self, observations: list["Observation"], dests: list[list[int]]) -> "torch.Tensor": ...
    def act(self, start: int, count: int, observation_ids: list[int]) -> None: ...
    def begin(self, request: "Request", slot: int, logits: "torch.Tensor") -> None: ...
    def decode(self, max_steps: int | None) -> None: ...
    def admit(self, new: list["Request"], *, unlimited: bool = False) -> list["Request"]: ...

SETTINGS = ("baseline", "parallel", "shared_kv", "oxygen")

NewRequests = list[tuple["Request", "int | None"]]


def run_frame(setting: str, engine: "Engine", observations: list["Observation"], new: NewRequests,
              k: int) -> None:
    """One frame of ``setting``: the action chunk of every observation, and the tokens."""
    {"baseline": baseline, "parallel": parallel, "shared_kv": shared_kv, "oxygen": oxygen}[setting](
        engine, observations, new, k)


# ---------------------------------------------------------------------- isolated tasks
def _actions_isolated(engine: "Engine", observations: list["Observation"]) -> None:
    for i, obs in enumerate(observations):
        slot = engine.pool.allocate(SCRATCH)
        try:
            engine.prefill([obs], [[slot]])
            engine.act(slot, 1, [i])
        finally:
            engine.pool.release(slot)


def _language_isolated(engine: "Engine", new: NewRequests) -> None:
    """Each request in turn: its prefill into a slot taken just before, then all of its
    decoding (the request, done, frees the slot): one slot at a time, however many start."""
    for request, _ in new:
        slot = engine.pool.allocate(SCRATCH)
        logits = engine.prefill([request.observation], [[slot]])
        engine.begin(request, slot, logits[0])
        engine.decode(None)


def _all_pending(engine: "Engine", new: NewRequests) -> NewRequests:
    """Isolated settings start every request in the frame it arrives (and any left
    queued by an earlier failure), one at a time, so none waits for a slot."""
    index = dict((r.id, i) for r, i in new)
    return [(r, index.get(r.id)) for r in engine.admit([r for r, _ in new], unlimited=True)]


def _finish_interrupted(engine: "Engine") -> None:
    """Isolated settings decode a request to its end in the frame it starts: one
    still running was interrupted by a failed frame, and finishes first."""
    engine.decode(None)


def baseline(engine: "Engine", observations, new: NewRequests, k: int) -> None:
    _actions_isolated(engine, observations)
    _finish_interrupted(engine)
    _language_isolated(engine, _all_pending(engine, new))


def parallel(engine: "Engine", observations, new: NewRequests, k: int) -> None:
    new = _all_pending(engine, new)
    failure: list[BaseException] = []

    def language() -> None:
        try:
            _on_own_stream(engine, _finish_interrupted, engine)
            _on_own_stream(engine, _language_isolated, engine, new)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread below
            failure.append(e)

    thread = threading.Thread(target=language, name="oxygen-language")
    thread.start()
    try:
        _on_own_stream(engine, _actions_isolated, engine, observations)
    finally:
        thread.join()
    if failure:
        raise failure[0]


def _on_own_stream(engine: "Engine", fn, *args):
    """Run ``fn`` on a CUDA stream of its own when the model is on a GPU (so the two
    tasks overlap on the device, as MPS/streams do in the paper), else as is."""
    device = engine.model.device
    if device.type != "cuda":
        return fn(*args)
    import torch

    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        out = fn(*args)
    stream.synchronize()
    return out


# ---------------------------------------------------------------------- shared prefill
def _shared_prefill(engine: "Engine", observations, starting: list["Request"], index: dict[int, int | None]):
    """Prefill this frame's observations once into a run of slots (plus rows for
    starting requests that read an older observation), denoise the run, and
    hand each observation's slot to its first starting request.

    Returns (request, slot, logits row) for every starting request.
    """
    pool = engine.pool
    n = len(observations)
    run = pool.allocate_run(n, SCRATCH) if n else 0
    dests = [[run + i] for i in range(n)]
    rows: list[tuple["Request", int, int]] = []  # request, slot, prefill row
    extra_obs = []
    claimed = set()
    for r in starting:
        i = index.get(r.id)
        if i is not None and i not in claimed:
            claimed.add(i)
            rows.append((r, run + i, i))
        elif i is not None:
            slot = pool.allocate(SCRATCH)
            dests[i].append(slot)
            rows.append((r, slot, i))
        else:
            slot = pool.allocate(SCRATCH)
            rows.append((r, slot, n + len(extra_obs)))
            extra_obs.append(r.observation)
            dests.append([slot])
    if n or extra_obs:
        logits = engine.prefill(list(observations) + extra_obs, dests)
    if n:
        engine.act(run, n, list(range(n)))
    for i in range(n):
        if i not in claimed:
            pool.release(run + i)
    return [(r, slot, logits[row]) for r, slot, row in rows]


def _shared_frame(engine: "Engine", observations, new: NewRequests, decode_steps: int | None) -> None:
    index = {r.id: i for r, i in new}
    starting = engine.admit([r for r, _ in new])
    for r, slot, logits in _shared_prefill(engine, observations, starting, index):
        engine.begin(r, slot, logits)
    engine.decode(decode_steps)


def shared_kv(engine: "Engine", observations, new: NewRequests, k: int) -> None:
    """The frame's new requests decode to completion (``decode(None)``)."""
    _shared_frame(engine, observations, new, None)


def oxygen(engine: "Engine", observations, new: NewRequests, k: int) -> None:
    """Every active request advances ``k`` tokens."""
    _shared_frame(engine, observations, new, k)
