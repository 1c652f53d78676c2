"""The Mixture-of-Transformers VLA: SigLIP + Gemma VLM + adaRMS Gemma action expert.

Three cached operations, each on storage the caller owns (:class:`KVCache`):

* :meth:`VLA.prefill` - vision + VLM over a batch of observations; writes each
  observation's prefix keys/values into the slot(s) it is given and returns the
  prefix lengths and the logits of the last valid prefix token.
* :meth:`VLA.denoise` - flow-matching action chunks for a run of slots, reading
  their prefix keys/values in place and never writing them.
* :meth:`VLA.extend` / :meth:`VLA.decode_step` - one or more new tokens per
  slot at per-row positions, appended to the slot in place.

:func:`.joint.forward_joint` is the uncached joint forward (both streams, any
mask) used for training and as the reference the cached paths are tested
against.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .cache import KVCache, SlotView
from .config import ModelConfig
from .flow_time import flow_dt, flow_times, time_embedding
from .gemma import GemmaStack, attend, attend_cached, attend_prefix, attention_bias, rope, rotary
from .precision import TORCH_DTYPES, set_precision
from .vision import VisionEncoder



@dataclass(frozen=True)
class PrefixBatch:
    """Model-ready prefix inputs (see ``observation.py`` for how they are built)."""

    pixels: Tensor  # [B, C, 3, S, S] uint8 colour planes (make_prefix_batch), or float in [-1, 1]
    image_mask: Tensor  # [B, C] bool: camera present
    tokens: Tensor  # [B, L] long, right-padded
    token_mask: Tensor  # [B, L] bool
    #: each row's prompt tokens (``token_mask``'s sums) where the batch's builder counted them:
    #: a compiled prefill then sizes its bucket without a tensor operation. A batch copied with
    #: another ``token_mask`` must set it again (or to None: counted from the mask)
    prompt_lengths: tuple[int, ...] | None = None

    @property
    def size(self) -> int:
        return self.tokens.shape[0]


@dataclass(frozen=True)
class PrefillResult:
    lengths: Tensor  # [B] valid prefix tokens written to each slot
    logits: Tensor  # [B, vocab] at the last valid prefix token


class VLA(nn.Module):
    def __init__(self, config: ModelConfig, *, seed: int = 0):
        super().__init__()
        self.config = config
        c = config
        ew = c.expert.width
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.vision = VisionEncoder(c.vision, c.vlm.width)
            self.language_model = GemmaStack(c.vlm, vocab_size=c.vocab_size, cond_dim=None, eps=c.rms_eps)
            self.expert = GemmaStack(c.expert, vocab_size=None, cond_dim=ew, eps=c.rms_eps)
            self.action_in_proj = nn.Linear(c.action_dim, ew)
            self.action_out_proj = nn.Linear(ew, c.action_dim)
            self.time_mlp_in = nn.Linear(ew, ew)
            self.time_mlp_out = nn.Linear(ew, ew)

    # ------------------------------------------------------------------ helpers
    @property
    def dtype(self) -> torch.dtype:
        """The dtype the transformers run in (the KV cache's, the activations')."""
        return self.expert.layers[0].self_attn.q_proj.weight.dtype

    @property
    def action_dtype(self) -> torch.dtype:
        """The dtype of the actions and the flow's ``x_t`` (float32 under bfloat16, as openpi's)."""
        return self.action_in_proj.weight.dtype

    def embed_actions(self, x_t: Tensor) -> Tensor:
        """Noisy actions [B, H, A] -> the expert's input tokens (in the model's dtype)."""
        return self.action_in_proj(x_t.to(self.action_dtype)).to(self.dtype)

    def actions_out(self, h: Tensor) -> Tensor:
        """The expert's final hidden states -> the velocity [B, H, A] (in the actions' dtype)."""
        return self.action_out_proj(h.to(self.action_dtype))

    @property
    def device(self) -> torch.device:
        return self.action_in_proj.weight.device

    def new_cache(self, slots: int, max_len: int) -> KVCache:
        """Storage with this model's layer/head layout, dtype and device."""
        c = self.config.vlm
        return KVCache.allocate(
            layers=c.depth, kv_heads=c.kv_heads, head_dim=c.head_dim, slots=slots, max_len=max_len,
            dtype=self.dtype, device=self.device,
        )

    def _rotary(self, positions: Tensor):
        return rotary(positions, self.config.vlm.head_dim, self.config.rope_base, self.dtype)

    def _bias(self, allowed: Tensor) -> Tensor:
        c = self.config.vlm
        return attention_bias(allowed, c.heads // c.kv_heads, self.dtype)

    def embed_prefix(self, batch: PrefixBatch, *, skip_absent: bool = False) -> tuple[Tensor, Tensor]:
        """Images then text, as π0.5 orders its prefix. Returns x [B, P, W], valid [B, P].

        ``skip_absent``: cameras whose mask is off do not go through the vision
        tower (their tokens, invalid anyway, are zeros); the shapes then stay
        the same but the amount of work depends on the mask."""
        b, cams = batch.image_mask.shape
        pixels = batch.pixels.flatten(0, 1).to(self.device)
        if skip_absent:
            img = self._present_images(pixels, batch.image_mask.flatten().to(self.device))
        else:
            img = self.vision(pixels)  # [B*C, N, W]
        n = img.shape[1]
        img = img.view(b, cams * n, -1)
        img_valid = batch.image_mask.to(self.device).repeat_interleave(n, dim=1)
        txt = self.language_model.embed(batch.tokens.to(self.device))
        x = torch.cat([img.to(self.dtype), txt.to(self.dtype)], dim=1)
        valid = torch.cat([img_valid, batch.token_mask.to(self.device)], dim=1)
        return x, valid

    def _present_images(self, pixels: Tensor, present: Tensor) -> Tensor:
        """The vision tower over the images flagged ``present`` only; zeros for the others."""
        out = torch.zeros(pixels.shape[0], self.config.vision.tokens_per_image, self.config.vlm.width,
                          dtype=self.dtype, device=self.device)
        rows = present.nonzero().squeeze(1)
        if rows.numel():
            out.index_copy_(0, rows, self.vision(pixels.index_select(0, rows)).to(self.dtype))
        return out

    def time_condition(self, t: Tensor) -> Tensor:
        emb = time_embedding(t, self.config.expert.width).to(self.time_mlp_in.weight.dtype)
        emb = nn.functional.silu(self.time_mlp_in(emb))
        return nn.functional.silu(self.time_mlp_out(emb))

    # ------------------------------------------------------------------ prefill
    @torch.inference_mode()
    def prefill(self, batch: PrefixBatch, cache: KVCache, slots: Sequence[Sequence[int]]) -> PrefillResult:
        """Write each observation's prefix K/V into its slot(s).

        ``slots[b]`` lists the destination slots of observation ``b`` (one or
        more: the prefix is computed once and stored where each consumer needs
        it). The prefix is stored compacted: its valid tokens at positions
        ``0 .. length-1``, which equal their π0.5 positions.
        """
        if len(slots) != batch.size:
            raise ValueError(f"prefill got {batch.size} observations but {len(slots)} slot lists")
        rows = [b for b, dest in enumerate(slots) for _ in dest]
        dest = [s for d in slots for s in d]
        if any(len(d) == 0 for d in slots):
            raise ValueError("every observation needs at least one destination slot")
        if any(not 0 <= s < cache.slots for s in dest):
            raise ValueError(f"slot out of range 0..{cache.slots - 1}: {dest}")
        x, lengths = self.prefix_states(batch, trim=True)
        if x.shape[1] > cache.max_len:
            raise ValueError(f"prefix of {x.shape[1]} tokens does not fit slots of {cache.max_len}")
        row_idx = torch.tensor(rows, device=x.device)
        slot_idx = torch.tensor(dest, device=x.device)
        unmasked = int(lengths.min()) == x.shape[1]  # every row all valid: attention needs no mask
        logits = self.write_prefix(cache, x, lengths, slot_idx, row_idx, unmasked=unmasked)
        return PrefillResult(lengths=lengths, logits=logits)

    def prefix_states(self, batch: PrefixBatch, *, trim: bool = False) -> tuple[Tensor, Tensor]:
        """The embedded prefix compacted (valid tokens first, in order): x [B, P, W], lengths [B].

        ``trim``: absent cameras skip the vision tower and ``P`` is the longest
        valid prefix of the batch instead of the padded prefix length (the
        valid tokens, hence the prefix and the logits, are the same; the shape
        then depends on the data, so the fixed-shape pieces keep ``trim`` off)."""
        x, valid = self.embed_prefix(batch, skip_absent=trim)
        lengths = valid.sum(dim=1)
        order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)
        if trim:
            order = order[:, : int(lengths.max())]
        return torch.gather(x, 1, order[..., None].expand(-1, -1, x.shape[-1])), lengths

    def write_prefix(self, cache: KVCache, x: Tensor, lengths: Tensor, slot_idx: Tensor,
                     row_idx: Tensor | None = None, *, unmasked: bool = False) -> Tensor:
        """Run the VLM over compacted prefixes x [B, P, W], storing row ``row_idx[j]``'s keys and
        values in slot ``slot_idx[j]`` (``row_idx`` None: row j into slot j). Returns the logits
        [B, vocab] (float32) at each row's last valid token. ``unmasked``: the caller knows
        every row holds ``P`` valid tokens, so attention runs without a mask."""
        b, p, _ = x.shape
        pos = torch.arange(p, device=x.device)
        w_slot = slot_idx[:, None].expand(-1, p).reshape(-1)  # token j of destination d: slot d, position j
        w_pos = pos.repeat(slot_idx.shape[0])
        table = self._rotary(pos.expand(b, p))
        key_valid = None if unmasked else pos[None, :] < lengths[:, None]
        for i, layer in enumerate(self.language_model.layers):
            q, k, v, gate = layer.pre_attention(x, None)
            q, k = rope(q, table), rope(k, table)
            rows_k, rows_v = (k, v) if row_idx is None else (k[row_idx], v[row_idx])
            cache.write(i, w_slot, w_pos, rows_k.transpose(1, 2).flatten(0, 1), rows_v.transpose(1, 2).flatten(0, 1))
            x = layer.post_attention(x, attend_prefix(q, k, v, key_valid), gate, None)
        h, _ = self.language_model.norm(x)
        last = h[torch.arange(b, device=h.device), lengths - 1]
        return self.language_model.logits(last).float()

    # ------------------------------------------------------------------ actions
    @torch.inference_mode()
    def denoise(self, cache: KVCache, view: SlotView, noise: Tensor, steps: int | None = None,
                before_step: Callable[[], None] | None = None) -> Tensor:
        """Euler flow matching from noise at t=1 to actions at t=0 over cached prefixes.

        noise [B, H, action_dim] with B = view.rows. The prefix keys/values are
        read in place and left untouched. ``before_step`` (if given) is called
        before each of the steps (a point where the caller may pause the frame).
        """
        b = noise.shape[0]
        if b != view.rows:
            raise ValueError(f"noise has {b} rows but the view has {view.rows} slots")
        prefix = [
            (cache.k[i, view.start : view.stop, :, : view.max_len], cache.v[i, view.start : view.stop, :, : view.max_len])
            for i in range(self.config.expert.depth)
        ]
        return self.denoise_from(prefix, view.lengths.to(self.device), noise, steps, before_step)

    def denoise_from(self, prefix: list[tuple[Tensor, Tensor]], lengths: Tensor, noise: Tensor,
                     steps: int | None = None, before_step: Callable[[], None] | None = None) -> Tensor:
        """:meth:`denoise` over per-layer prefix keys/values [B, KV, L, D] whose row ``i``
        holds ``lengths[i]`` valid tokens (positions past them are masked)."""
        steps = steps or self.config.denoise_steps
        context = self._denoise_context(prefix, lengths, noise.shape[1])
        x_t = noise.to(self.device, self.action_dtype)
        layers, final = self.denoise_modulations(steps)
        dt = flow_dt(steps, self.device)
        for step in range(steps):
            if before_step is not None:
                before_step()
            at = slice(step, step + 1)  # [.., 1, 3W]: broadcast over the rows
            x_t = self._euler_step(x_t, layers[:, :, at], final[at], context, dt)
        return x_t

    def denoise_modulations(self, steps: int) -> tuple[Tensor, Tensor]:
        """Every adaptive norm's scale, shift and gate at each of the ``steps`` flow times:
        per layer [depth, 2 (input, post-attention), S, 3W] and the final norm's [S, 3W].

        They depend on the step only, not on the rows: each norm's dense layer runs once
        over all S steps' conditions, so the steps read none of their weights (in π0.5,
        float32 layers of 3 * 1024 x 1024: about 40% of the bytes a step would read otherwise)."""
        times, _ = flow_times(steps, self.device)
        layers, final = self.expert.modulations(self.time_condition(times))
        return torch.stack([torch.stack(pair) for pair in layers]), final

    def denoise_step(self, prefix: list[tuple[Tensor, Tensor]], lengths: Tensor, x_t: Tensor, step: Tensor,
                     layers: Tensor, final: Tensor, steps: int) -> Tensor:
        """Step number ``step`` [1] long of :meth:`denoise_from`'s ``steps`` Euler steps, alone:
        x_t [B, H, A] -> the next x_t. ``layers`` and ``final`` are :meth:`denoise_modulations`
        of ``steps`` (every step's, picked here: one graph serves every step)."""
        context = self._denoise_context(prefix, lengths, x_t.shape[1])
        return self._euler_step(x_t, layers.index_select(2, step), final.index_select(0, step), context,
                                flow_dt(steps, self.device))

    def _denoise_context(self, prefix: list[tuple[Tensor, Tensor]], lengths: Tensor, horizon: int):
        """What every step of one denoise reads besides x_t: the prefix and its masks, and the
        action tokens' rotary table."""
        b, read = lengths.shape[0], prefix[0][0].shape[2]
        pos = torch.arange(read, device=self.device)
        prefix_bias = self._bias((pos[None, :] < lengths[:, None])[:, None, :].expand(b, horizon, read))
        suffix_bias = self._bias(torch.ones(b, horizon, horizon, dtype=torch.bool, device=self.device))
        table = self._rotary(lengths[:, None] + torch.arange(horizon, device=self.device))
        return prefix, prefix_bias, suffix_bias, table

    def _euler_step(self, x_t: Tensor, layers: Tensor, final: Tensor, context, dt: Tensor) -> Tensor:
        """x_t + dt * v_t, with one step's modulations ``layers`` [depth, 2, 1, 3W], ``final`` [1, 3W]."""
        v_t = self._velocity(x_t, [(m[0], m[1]) for m in layers], final, *context)
        return x_t + dt * v_t

    def _velocity(self, x_t, modulations, final, prefix, prefix_bias, suffix_bias, table) -> Tensor:
        x = self.embed_actions(x_t)
        for (kp, vp), layer, (pre, post) in zip(prefix, self.expert.layers, modulations):
            q, k, v, gate = layer.pre_attention(x, None, pre)
            q, k = rope(q, table), rope(k, table)
            attn = attend(q, [(kp, vp, prefix_bias), (k, v, suffix_bias)])
            x = layer.post_attention(x, attn, gate, None, post)
        h, _ = self.expert.norm(x, modulation=final)
        return self.actions_out(h)

    # ------------------------------------------------------------------ language
    @torch.inference_mode()
    def extend(self, cache: KVCache, view: SlotView, tokens: Tensor, token_mask: Tensor | None = None) -> Tensor:
        """Append up to T tokens per slot (causal) and return logits [B, vocab]
        at each row's last appended token.

        tokens [B, T] left-aligned; ``token_mask`` marks the real ones (default:
        all). Row ``i`` writes at positions ``lengths[i] ..``; rows that are not
        live, and masked tokens, write to the trash slot instead.
        """
        b, t = tokens.shape
        if b != view.rows:
            raise ValueError(f"{b} token rows for a view of {view.rows} slots")
        if view.max_len + t > cache.max_len:
            raise ValueError(f"slot overflow: {view.max_len} + {t} tokens > slot length {cache.max_len}")
        dev = self.device
        if token_mask is None:
            token_mask = torch.ones(b, t, dtype=torch.bool, device=dev)
        token_mask = token_mask.to(dev)
        positions = view.lengths.to(dev)[:, None] + torch.arange(t, device=dev)  # [B, T]
        writes = token_mask if view.live is None else token_mask & view.live.to(dev)[:, None]
        return self.extend_rows(cache, view.start, tokens.to(dev), token_mask, positions, writes, view.max_len + t)

    def extend_rows(self, cache: KVCache, start: int, tokens: Tensor, token_mask: Tensor, positions: Tensor,
                    writes: Tensor, read: int) -> Tensor:
        """:meth:`extend` over slots ``start ..`` (one per row of ``tokens`` [B, T]) at
        ``positions`` [B, T]; tokens whose ``writes`` flag is off go to the trash slot.
        Reads the first ``read`` positions of each slot (those past a token's own
        position are masked)."""
        b, t = tokens.shape
        dev = tokens.device
        steps = torch.arange(t, device=dev)
        slot_rows = torch.arange(start, start + b, device=dev)[:, None].expand(b, t)
        w_slot = torch.where(writes, slot_rows, cache.trash_slot).reshape(-1)
        w_pos = torch.where(writes, positions, steps[None, :].expand(b, t)).reshape(-1)
        allowed = torch.arange(read, device=dev)[None, None, :] <= positions[:, :, None]  # [B, T, read]
        table = self._rotary(positions)
        x = self.language_model.embed(tokens).to(self.dtype)
        for i, layer in enumerate(self.language_model.layers):
            q, k, v, gate = layer.pre_attention(x, None)
            q, k = rope(q, table), rope(k, table)
            cache.write(i, w_slot, w_pos, k.transpose(1, 2).flatten(0, 1), v.transpose(1, 2).flatten(0, 1))
            kv_k = cache.k[i, start : start + b, :, :read]
            kv_v = cache.v[i, start : start + b, :, :read]
            x = layer.post_attention(x, attend_cached(q, kv_k, kv_v, allowed), gate, None)
        last = (token_mask.sum(dim=1) - 1).clamp(min=0)
        h, _ = self.language_model.norm(x[torch.arange(b, device=dev), last][:, None, :])
        return self.language_model.logits(h[:, 0]).float()

    def decode_step(self, cache: KVCache, view: SlotView, tokens: Tensor) -> Tensor:
        """One token per slot: append its K/V at ``lengths[i]``, return next-token logits."""
        return self.extend(cache, view, tokens.reshape(-1, 1))


def build_model(config: ModelConfig, *, seed: int = 0, device: str = "cpu", dtype: str = "float32") -> VLA:
    """A randomly initialised model (deterministic for a seed) in eval mode, in ``dtype``
    (see :func:`set_precision` for what stays float32 under bfloat16)."""
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(TORCH_DTYPES)}, got {dtype!r}")
    if device.split(":")[0] not in ("cpu", "cuda", "meta"):
        raise ValueError(f"device must be cpu, cuda[:N] or meta, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    with torch.device(device):  # built in place: no CPU copy for cuda, no memory at all for "meta"
        model = VLA(config, seed=seed)
    return set_precision(model, dtype).eval()
