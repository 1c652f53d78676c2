"""What runs the model's pieces for the engine: the compiled graphs when there are, else the model eager.

The engine decides which slots a piece reads and writes; the runner only runs
it. It owns the compile decision (``compile_reason`` says why a model runs
eager), the warm-up of every shape bucket, the recompile count, and greedy
token choice over the ids the tokenizer can decode. A frame planned with
another S than the compiled one denoises eager. Compiled, a decode call runs
up to a frame's ``steps_per_frame`` steps in one graph; eager, one step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch

from .engine_config import EngineConfig
from .model.cache import KVCache, SlotView
from .model.compile_setup import failure_reason, resolve_compile
from .model.compiled import CompiledVLA, Progress
from .model.vla import VLA, PrefillResult, PrefixBatch


class ModelRunner:
    def __init__(self, model: VLA, cache: KVCache, config: EngineConfig, *, max_cameras: int,
                 denoise_steps: int, vocab_limit: int):
        self.model = model
        self.vocab_limit = vocab_limit
        # the ids a compiled decode may choose, made on the model's device once (not copied there each call)
        self._allowed = torch.arange(model.config.vocab_size, device=model.device) < vocab_limit
        self._warm_lock = threading.Lock()  # the two threads of ``parallel`` must not both compile
        decision = resolve_compile(config.compile, model.device)
        #: why the model runs eager ("" when compiled): for the caller to log once
        self.compile_reason = decision.reason
        self.compiled: CompiledVLA | None = None
        if decision.enabled:
            try:
                self.compiled = CompiledVLA(model, cache, steps=denoise_steps,
                                            max_observations=config.max_observations_per_frame,
                                            max_cameras=max_cameras, decode_steps=max(1, config.steps_per_frame))
            except Exception as e:  # a torch that cannot compile here: run eager
                self.compile_reason = failure_reason(e)

    def warm_up(self, progress: Progress | None = None, note: Callable[[str], None] | None = None) -> None:
        """Compile every bucket (``progress(done, total, what)`` after each; ``note(text)`` while it
        waits for another process building into the same cache); nothing when eager.
        The first piece run does it if the caller has not. If compilation fails the model
        runs eager and :attr:`compile_reason` says why."""
        with self._warm_lock:
            if self.compiled is None or self.compiled.warmed:
                return
            try:
                self.compiled.warm_up(progress, note)
            except Exception as e:
                self.compiled, self.compile_reason = None, failure_reason(e, self.compiled.cache_dir)

    @property
    def recompiles(self) -> int:
        """Graphs compiled after warm-up (0 in a steady state, and when eager)."""
        return 0 if self.compiled is None else self.compiled.recompiles

    def prefill(self, batch: PrefixBatch, cache: KVCache, dests: Sequence[Sequence[int]]) -> PrefillResult:
        return self._pieces().prefill(batch, cache, dests)

    def denoise(self, cache: KVCache, view: SlotView, noise: torch.Tensor, steps: int,
                before_step: Callable[[], None] | None) -> torch.Tensor:
        pieces = self._pieces()
        if pieces is not self.model and pieces.steps != steps:
            pieces = self.model  # compiled for the configured S; a frame planned with another S runs eager
        return pieces.denoise(cache, view, noise, steps, before_step=before_step)

    def decode(self, cache: KVCache, view: SlotView, tokens: Sequence[int], remaining: Sequence[int],
               eos_id: int, steps: int) -> list[list[int]]:
        """Up to ``steps`` greedy decode steps for the view's rows in one call (compiled: as many as
        its loop takes, see ``CompiledVLA.decode``; eager: one): each row's tokens, one per step run
        (a row's tokens after its end-of-sequence token or its ``remaining`` are not its own)."""
        pieces = self._pieces()
        if pieces is self.model:
            logits = self.model.decode_step(cache, view, torch.tensor(tokens))
            return [[t] for t in self.greedy(logits).tolist()]
        return pieces.decode(cache, view, tokens, remaining, self._allowed, eos_id, steps).tolist()

    def greedy(self, logits: torch.Tensor) -> torch.Tensor:
        """The most likely token among those the tokenizer can decode."""
        if self.vocab_limit < logits.shape[-1]:
            logits = logits[..., : self.vocab_limit]
        return logits.argmax(dim=-1)

    def _pieces(self) -> VLA | CompiledVLA:
        if self.compiled is not None and not self.compiled.warmed:
            self.warm_up()
        return self.compiled or self.model
