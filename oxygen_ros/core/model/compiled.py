"""The model's prefill, denoise and decode step compiled ahead of time, once per shape bucket.

:class:`CompiledVLA` has the signatures of :class:`~.vla.VLA`'s ``prefill``,
``denoise`` and ``decode_step``, and runs them as
the fixed-shape pieces of ``static.py``, each bucket an AOTInductor package
(``packaged.py``): exported and compiled to a shared library once, kept in the
compile cache, and loaded in milliseconds by every later start. A call runs
the library directly (no guards, no Python between kernels). On CUDA each
bucket is also captured as a CUDA graph after its first run (one launch per
piece).

Every package loaded is counted (:attr:`CompiledVLA.graphs`, of which
:attr:`CompiledVLA.built` were compiled rather than found in the cache);
:attr:`CompiledVLA.recompiles` counts those loaded after warm-up, which a
steady state never does. Differences from eager, by design:

* the whole denoise loop is one call, so ``before_step`` (the engine's pause
  point) is called once before the loop, not before each step. For a small
  expert on a CPU the package holds the loop. Otherwise (:func:`denoise_loops`)
  the package is one step (the step an input) and the call runs it S times;
  on CUDA the S calls are captured as one CUDA graph, which replays as one
  launch all the same. A package of the loop repeats each step's code S
  times: π0.5's was still compiling when an 8-minute run on an H200 machine ended;
* :meth:`CompiledVLA.decode` runs up to ``decode_steps`` K greedy decode steps
  as one graph, a loop whose length is an input (the tokens chosen in it), so
  that a frame's k <= K decode steps are one call, not k; its batch buckets
  are the warm-up's decode graphs (on CUDA, where a captured graph cannot loop
  a data-dependent number of times, and with a torch that cannot export the
  loop's writes to the pool (2.11): the step, once per call);
* a question's tokens (``VLA.extend``) run eager: on demand, any length.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import torch
from torch import Tensor

from .buckets import batch_buckets, bucket_for, fit_prefill, padded, prompt_buckets
from .cache import KVCache, SlotView
from .compile_setup import loops_can_write_in_place, use_compile_cache
from .cuda_graphs import CudaGraphs
from .package_builds import Build, build_missing
from .packaged import PackagedPiece, package_path
from .static import StaticPieces, greedy_allowed
from .vla import VLA, PrefillResult, PrefixBatch

Progress = Callable[[int, int, str], None]

#: the largest action expert (parameters) whose denoise package holds the whole loop on a CPU
LOOP_EXPERT_LIMIT = 100_000_000


def denoise_loops(model: VLA) -> bool:
    """Whether ``model``'s denoise package should hold the whole loop of S steps (else one step's
    package is called S times). On CUDA never: the S calls are captured as one graph anyway. On a
    CPU for a small expert only: the loop spares S - 1 calls of some 30 us each, which matters
    beside a step of the default model's (0.16 ms) but not of π0.5's (over 100 ms), whose loop
    package took 463 s to compile here against 44 s for one step's (bfloat16, S = 10)."""
    if model.device.type == "cuda":
        return False
    return sum(p.numel() for p in model.expert.parameters()) <= LOOP_EXPERT_LIMIT


class CompiledVLA:
    """``model``'s pieces on ``cache`` (the pool's storage), for ``steps`` denoise steps, decode
    batches up to the cache's slot count and prefill/denoise batches up to ``max_observations``.
    A prefill's graphs take ``max_cameras`` camera slots (default: the model's), each row's
    present cameras first: a robot with fewer cameras than the model has slots never runs
    the vision tower or the VLM over the slots it cannot fill.
    ``decode_steps`` K: the most decode steps one :meth:`decode` call runs.
    ``compile=False`` runs the same bucketed pieces eager (a test hook: the bucketing without
    the compile time). ``decode_loop``: whether a decode call runs its steps as one loop graph
    (None: everywhere but on CUDA, where a captured graph replays fixed work and a call runs
    one step). ``denoise_loop``: whether the denoise package holds the whole loop, else one
    step's package is called S times (None: :func:`denoise_loops`)."""

    def __init__(self, model: VLA, cache: KVCache, *, steps: int, max_observations: int,
                 max_cameras: int | None = None, decode_steps: int = 1, compile: bool = True,
                 decode_loop: bool | None = None, denoise_loop: bool | None = None):
        self.model, self.cache, self.steps = model, cache, steps
        if decode_steps < 1:
            raise ValueError(f"decode_steps must be >= 1, got {decode_steps}")
        #: whether decode steps run as one loop graph
        if decode_loop is None:  # the loop needs a torch that can trace its writes to the pool (eager too)
            decode_loop = model.device.type != "cuda" and loops_can_write_in_place()
        self.loops = decode_loop
        #: whether a denoise package runs the whole loop (else one step, called S times)
        self.denoise_loops = denoise_loops(model) if denoise_loop is None else denoise_loop
        #: the most decode steps one :meth:`decode` call runs
        self.decode_steps = decode_steps if self.loops else 1
        slots = model.config.max_cameras
        if max_cameras is not None and not 1 <= max_cameras <= slots:
            raise ValueError(f"max_cameras must be 1..{slots} (the model's camera slots), got {max_cameras}")
        self.decode_buckets = batch_buckets(cache.slots)
        self.observation_buckets = batch_buckets(max_observations)
        self.camera_buckets = (max_cameras or slots,)  # one: a camera that drops out is masked in it
        self.prompt_buckets = prompt_buckets(model.config.max_token_len)
        self.cache_dir = use_compile_cache()
        self.graphs = 0  # packages loaded, ...
        self.built = 0  # ... of which compiled here (not found in the cache)
        self._graphs_at_warm: int | None = None
        self._static = StaticPieces(model, cache, steps)
        #: whether the pieces are compiled packages (False: the same buckets, eager)
        self.compiling = compile
        self._pieces: dict[tuple, Callable[..., object]] = {}
        self._columns = torch.arange(self.decode_steps)  # its length is the loop's K (a graph input)
        self._constants: dict[tuple[int, ...], Tensor] = {}  # see _constant
        # tensor([s]) on the device for each denoise step s: made here, never during a graph's capture
        self._step_numbers = [torch.tensor([s], device=model.device) for s in range(steps)]

    def _piece(self, name: str, inputs: tuple[Tensor, ...]) -> Callable[..., object]:
        """The graph of piece ``name`` at the shapes of ``inputs``: loaded (or built) on first use."""
        key = (name, *[t.shape for t in inputs])  # torch.Size: a tuple
        piece = self._pieces.get(key)
        if piece is None:
            package, package_inputs = self._package(name, inputs)
            piece = self._load(package, package_inputs)
            if package == "denoise_step":
                piece = functools.partial(self._stepped_denoise, piece)
            if self.compiling and self.model.device.type == "cuda":
                piece = CudaGraphs(piece)
            self._pieces[key] = piece
        return piece

    def _package(self, name: str, inputs: tuple[Tensor, ...]) -> tuple[str, tuple[Tensor, ...]]:
        """The package (piece and inputs) that runs piece ``name`` on ``inputs``."""
        if name == "denoise" and not self.denoise_loops:
            slots, lengths, noise = inputs
            layers, final = self._modulations()
            return "denoise_step", (slots, lengths, noise, self._step_numbers[0], layers, final)
        return name, inputs

    def _load(self, name: str, inputs: tuple[Tensor, ...]) -> Callable[..., object]:
        if not self.compiling:
            return getattr(self._static, name)
        with torch.inference_mode(False):  # export traces ordinary tensors
            example = tuple(t.clone() for t in inputs)
            packaged = PackagedPiece(self.model, self.cache, name, self.steps, example, self.cache_dir)
        self.graphs += 1
        self.built += packaged.built
        return packaged

    def _stepped_denoise(self, step: Callable[..., Tensor], slots: Tensor, lengths: Tensor, noise: Tensor) -> Tensor:
        """The denoise loop around a one-step piece (on CUDA, captured whole as one graph)."""
        layers, final = self._modulations()
        x = noise
        for number in self._step_numbers:
            x = step(slots, lengths, x, number, layers, final)
        return x

    def _modulations(self) -> tuple[Tensor, Tensor]:
        with torch.inference_mode():
            return self.model.denoise_modulations(self.steps)

    # ------------------------------------------------------------------ warm-up and counts
    @property
    def bucket_count(self) -> int:
        prefills = len(self.camera_buckets) * len(self.prompt_buckets)
        return len(self.decode_buckets) + len(self.observation_buckets) * (1 + prefills)

    @property
    def loaded(self) -> Mapping[tuple, Callable[..., object]]:
        """The graphs loaded so far, by (piece name, its inputs' shapes...), read-only."""
        return MappingProxyType(self._pieces)

    def unload(self) -> None:
        """Drop the graphs loaded: each loads again at its next use (from the cache), counted in :attr:`recompiles`."""
        self._pieces.clear()

    @property
    def cuda_graphs(self) -> int:
        """CUDA graphs captured (one per bucket run so far, on CUDA; 0 elsewhere)."""
        return sum(p.captured for p in self._pieces.values() if isinstance(p, CudaGraphs))

    @property
    def warmed(self) -> bool:
        return self._graphs_at_warm is not None

    @property
    def recompiles(self) -> int:
        """Graphs built after warm-up (0 in a steady state; every graph if not warmed up)."""
        return self.graphs - (self._graphs_at_warm or 0)

    def warm_up(self, progress: Progress | None = None, note: Callable[[str], None] | None = None) -> None:
        """Load every bucket's package, compiling those the cache lacks (several at a time, in
        worker processes: ``package_builds.py``); ``progress(done, total, what)`` after each (``what``
        names the bucket and says "compiled" or "from the cache"). ``note(text)`` says first what it
        is about to do (load them all from the cache, or compile how many), and later if it waits
        for another process building into the same cache (``build_lock.py``); then it builds what
        that one did not. Where they cannot be built, it raises (``compile_setup.CannotBuild``)
        before saying anything. Writes only the trash slot."""
        buckets = [(what, name, self._prepared(inputs)) for what, name, inputs in self.buckets()]
        done, fresh = 0, set()

        def report(what: str, how: str) -> None:
            nonlocal done
            done += 1
            if progress is not None:
                progress(done, len(buckets), what + how)

        if self.compiling:
            with torch.inference_mode(False):  # export traces ordinary tensors
                packages = [(what, *self._package(name, inputs)) for what, name, inputs in buckets]
                builds = [Build(what, name, self.steps, tuple(t.clone() for t in inputs),
                                package_path(self.cache_dir, self.model, name, self.steps, self.cache, inputs))
                          for what, name, inputs in packages]
                builds = build_missing(self.model, self.cache, builds, self.cache_dir,
                                       lambda b: report(b.what, " (compiled)"), note)
                fresh = {b.what for b in builds}
            self.built += len(builds)
        for what, name, inputs in buckets:
            self._run(name, *inputs)  # loads the package (built above, or found in the cache)
            if what not in fresh:
                report(what, " (from the cache)" if self.compiling else "")
        self._graphs_at_warm = self.graphs

    def buckets(self) -> list[tuple[str, str, tuple[Tensor, ...]]]:
        """Every bucket as (what, piece, the inputs a warm-up runs it on: they write the trash slot only)."""
        c, trash = self.model.config, self.cache.trash_slot
        if self.loops:
            out = [(f"decode batch {b} (up to {self.decode_steps} steps)", "decode_loop",
                    self._loop_inputs(*self._decode_inputs(b), torch.zeros(b, dtype=torch.long),
                                      torch.ones(c.vocab_size, dtype=torch.bool), -1, 1))
                   for b in self.decode_buckets]
        else:
            out = [(f"decode batch {b}", "decode", self._decode_inputs(b)) for b in self.decode_buckets]
        out += [(f"denoise observations {b}", "denoise",
                 self._denoise_inputs(torch.full((b,), trash), torch.zeros(b, dtype=torch.long),
                                      torch.zeros(b, c.action_horizon, c.action_dim)))
                for b in self.observation_buckets]
        size = c.vision.image_size
        for b in self.observation_buckets:
            for k in self.camera_buckets:
                for n in self.prompt_buckets:
                    mask = torch.zeros(b, n, dtype=torch.bool)
                    mask[:, 0] = True
                    batch = PrefixBatch(torch.zeros(b, k, 3, size, size, dtype=torch.uint8),
                                        torch.ones(b, k, dtype=torch.bool),
                                        torch.zeros(b, n, dtype=torch.long), mask)
                    out.append((f"prefill observations {b} cameras {k} prompt {n}", "prefill",
                                self._prefill_inputs(batch, torch.full((b,), trash))))
        return out

    # ------------------------------------------------------------------ the VLA's signatures
    def decode_step(self, cache: KVCache, view: SlotView, tokens: Tensor) -> Tensor:
        """:meth:`VLA.decode_step` for a view that starts at slot 0: the logits of one step (on the
        CPU not a warm-up bucket, where the engine decodes with :meth:`decode`)."""
        self._check(cache)
        if view.start != 0:
            raise ValueError(f"a compiled decode step reads slots from 0, got a view from slot {view.start}")
        return self._run("decode", *self._decode_inputs(view.rows, view, tokens))[: view.rows]

    def decode(self, cache: KVCache, view: SlotView, tokens: Tensor | Sequence[int], remaining: Tensor | Sequence[int],
               allowed: Tensor, eos_id: int, steps: int) -> Tensor:
        """Up to ``steps`` greedy decode steps over a view from slot 0, in one call: ``min(steps,
        decode_steps)`` (see :meth:`.static.StaticPieces.decode_loop`; on CUDA one step). ``remaining``
        [rows] tokens each row may still produce, ``allowed`` [vocab] bool -> chosen tokens [rows, n]
        (n: the steps run; a row's tokens after its end are not its own)."""
        self._check(cache)
        if view.start != 0:
            raise ValueError(f"a compiled decode reads slots from 0, got a view from slot {view.start}")
        if steps < 1:
            raise ValueError(f"a decode runs at least one step, asked for {steps}")
        n = min(steps, self.decode_steps)
        inputs = self._decode_inputs(view.rows, view, tokens)
        if not self.loops:
            logits = self._run("decode", *inputs)[: view.rows]
            return greedy_allowed(logits, allowed.to(logits.device))[:, None].cpu()
        left = padded(remaining, inputs[0].shape[0], torch.long)
        return self._run("decode_loop", *self._loop_inputs(*inputs, left, allowed, eos_id, n))[: view.rows, :n]

    def _decode_inputs(self, rows: int, view: SlotView | None = None, tokens: Tensor | None = None):
        """Tokens, lengths and live flags of a decode bucket's rows (one tensor each, built on the
        host: a few small tensor operations per input cost more than the list)."""
        b = bucket_for(rows, self.decode_buckets, "a decode batch")
        if view is None:
            return torch.zeros(b, dtype=torch.long), torch.zeros(b, dtype=torch.long), torch.zeros(b, dtype=torch.bool)
        live = [True] * rows if view.row_live is None else view.row_live
        return (padded(tokens, b, torch.long), padded(view.row_lengths, b, torch.long), padded(live, b, torch.bool))

    def denoise(self, cache: KVCache, view: SlotView, noise: Tensor, steps: int | None = None,
                before_step: Callable[[], None] | None = None) -> Tensor:
        """:meth:`VLA.denoise` as one graph; ``before_step`` is called once, before it."""
        self._check(cache)
        if steps not in (None, self.steps):
            raise ValueError(f"compiled for {self.steps} denoise steps, asked for {steps}")
        if noise.shape[0] != view.rows:
            raise ValueError(f"noise has {noise.shape[0]} rows but the view has {view.rows} slots")
        if before_step is not None:
            before_step()
        b = bucket_for(view.rows, self.observation_buckets, "a denoise batch")
        slots = self._constant((*range(view.start, view.stop), *[self.cache.trash_slot] * (b - view.rows)))
        if view.rows < b:
            noise = torch.cat([noise, noise.new_zeros(b - view.rows, *noise.shape[1:])])
        lengths = padded(view.row_lengths, b, torch.long)
        return self._run("denoise", *self._denoise_inputs(slots, lengths, noise))[: view.rows]

    def prefill(self, batch: PrefixBatch, cache: KVCache, slots: Sequence[Sequence[int]]) -> PrefillResult:
        """:meth:`VLA.prefill`: each observation's prefix is written into its first slot in the
        graph, then copied into its other slots (if any)."""
        self._check(cache)
        if batch.pixels.dtype != torch.uint8:
            raise ValueError(f"a compiled prefill takes the cameras' uint8 colour planes, as make_prefix_batch "
                             f"builds them, got pixels of {batch.pixels.dtype}")
        if len(slots) != batch.size or any(len(d) == 0 for d in slots):
            raise ValueError(f"prefill needs one non-empty slot list per observation, got {list(slots)} "
                             f"for {batch.size}")
        limit = self.observation_buckets[-1]
        parts = [self._prefill_part(batch, slots, i, min(i + limit, batch.size)) for i in range(0, batch.size, limit)]
        res = parts[0] if len(parts) == 1 else PrefillResult(lengths=torch.cat([p.lengths for p in parts]),
                                                             logits=torch.cat([p.logits for p in parts]))
        _copy_prefixes(cache, res.lengths.tolist(), slots)
        return res

    def _prefill_part(self, batch: PrefixBatch, slots, lo: int, hi: int) -> PrefillResult:
        part = fit_prefill(batch, lo, hi, self.observation_buckets, self.camera_buckets, self.prompt_buckets)
        rows = hi - lo
        dest = torch.tensor([d[0] for d in slots[lo:hi]] + [self.cache.trash_slot] * (part.size - rows))
        lengths, logits = self._run("prefill", *self._prefill_inputs(part, dest))
        return PrefillResult(lengths=lengths[:rows], logits=logits[:rows])

    def _check(self, cache: KVCache) -> None:
        if cache is not self.cache:
            raise ValueError("a CompiledVLA runs on the cache it was built for")

    # ------------------------------------------------------------------ running a graph
    def _prepared(self, tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """``tensors`` as every graph was built for them: on the device, contiguous."""
        device = self.model.device  # looked up once: a module attribute lookup per tensor showed in profiles
        return tuple(t.to(device).contiguous() for t in tensors)

    def _run(self, name: str, *tensors: Tensor):
        inputs = self._prepared(tensors)
        piece = self._piece(name, inputs)
        # also around a shared library's call: its operators (matrix products...) then skip autograd's
        # bookkeeping in the dispatcher (measured: a 5-step decode call 20-30 us faster under it).
        # A frame (Engine.step) is in the mode already: entering it again cost a microsecond a call
        if torch.is_inference_mode_enabled():
            return piece(*inputs)
        with torch.inference_mode():
            return piece(*inputs)

    def _loop_inputs(self, tokens: Tensor, lengths: Tensor, live: Tensor, remaining: Tensor, allowed: Tensor,
                     eos_id: int, steps: int) -> tuple[Tensor, ...]:
        return (tokens, lengths, live, remaining, allowed, self._constant((eos_id,)), self._columns,
                self._constant((steps,)))

    def _constant(self, values: tuple[int, ...]) -> Tensor:
        """``tensor(values)``, made once per values (a graph reads its inputs and never writes them):
        a loop's end-of-sequence id and step count, a denoise's run of slots."""
        t = self._constants.get(values)
        if t is None:
            t = self._constants[values] = torch.tensor(values)
        return t

    def _denoise_inputs(self, slots: Tensor, lengths: Tensor, noise: Tensor) -> tuple[Tensor, ...]:
        return slots, lengths, noise.to(self.model.action_dtype)

    def _prefill_inputs(self, batch: PrefixBatch, dest: Tensor) -> tuple[Tensor, ...]:
        return batch.pixels, batch.image_mask, batch.tokens, batch.token_mask, dest


def _copy_prefixes(cache: KVCache, lengths: Sequence[int], slots: Sequence[Sequence[int]]) -> None:
    """Each prefix (``lengths[i]`` tokens in slot ``slots[i][0]``) copied into its other slots, if any."""
    for length, dest in zip(lengths, slots):
        for extra in dest[1:]:
            cache.k[:, extra, :, :length] = cache.k[:, dest[0], :, :length]
            cache.v[:, extra, :, :length] = cache.v[:, dest[0], :, :length]

