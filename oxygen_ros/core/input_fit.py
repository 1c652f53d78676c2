"""Inputs cut to what the model takes: the instruction to the prompt, a question to its limit
(and a note on images far larger than the model's, :func:`oversized_images`).

Text is cleaned first (:func:`~oxygen_ros.core.text.clean_text`). Only the
first ``limit * CHARS_PER_TOKEN`` characters are looked at, so a megabyte of
text costs nothing. The instruction keeps the longest prefix whose prompt
(instruction and state) fits ``max_token_len``; the search is cached for the
instruction and state length seen last (a robot sends the same one for a while).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .observation import Observation
from .text import clean_text
from .tokenizer import Tokenizer, prompt_ids

#: Characters of a question / instruction kept per token of its limit before
#: tokenising (no SentencePiece piece is longer).
CHARS_PER_TOKEN = 100


@dataclass(frozen=True)
class FittedInstruction:
    observation: Observation  # with its instruction cleaned and cut
    truncated: bool  # the instruction was cut
    kept: int  # characters kept
    overflow: bool  # the prompt does not fit even without an instruction (the state is too long)
    new_cut: bool = False  # truncated, and not as the last cut instruction was (a new one to say)


@dataclass(frozen=True)
class FittedQuestion:
    text: str  # cleaned and stripped; empty: refused
    truncated: bool
    tokens: int  # tokens of the text (up to the characters looked at)


class InstructionFitter:
    """Cuts an observation's instruction so that its prompt fits ``max_token_len`` tokens."""

    def __init__(self, tokenizer: Tokenizer, max_token_len: int):
        self.tokenizer, self.max_token_len = tokenizer, max_token_len
        self._cache: tuple[str, int, int] | None = None  # (instruction, state length, characters kept)
        self._last_cut: tuple[str, int] | None = None  # the last instruction cut, and its cut

    def fit(self, obs: Observation, prompt_state=None) -> FittedInstruction:
        """``obs`` with its instruction cut to fit. ``prompt_state``: the state as the prompt will
        carry it (normalised with the checkpoint's statistics: its bins, hence its digits, are
        what the prompt's length depends on); None: ``obs.state`` as it is."""
        original, max_len = obs.instruction, self.max_token_len
        text = clean_text(original[:max_len * CHARS_PER_TOKEN])
        state = obs.state if prompt_state is None else prompt_state
        n_state = 0 if state is None else state.shape[0]

        def fits(n: int) -> bool:
            return len(prompt_ids(self.tokenizer, text[:n], state)) <= max_len

        keep, overflow = len(text), False
        if not fits(keep):
            cached = self._cache
            if cached is not None and cached[:2] == (text, n_state) and fits(cached[2]):
                keep = cached[2]
            else:
                overflow = not fits(0)
                keep = 0 if overflow else _longest_prefix(fits, len(text))
                self._cache = (text, n_state, keep)
        truncated = keep < len(text) or len(original) > max_len * CHARS_PER_TOKEN
        if truncated or text != original:
            obs = dataclasses.replace(obs, instruction=text[:keep])
        new_cut = truncated and self._last_cut != (original, keep)
        if new_cut:
            self._last_cut = (original, keep)
        return FittedInstruction(obs, truncated, keep, overflow, new_cut)


def fit_messages(fitted: FittedInstruction, original: int, seq: int, max_len: int) -> list[tuple[str, str, str]]:
    """What to log about observation ``seq``'s fit, as (key, level, text): a prompt too long even
    without its instruction; a new cut of an instruction of ``original`` characters (said once
    per instruction, not on every observation that carries it)."""
    out = []
    if fitted.overflow:
        n_state = 0 if fitted.observation.state is None else fitted.observation.state.shape[0]
        out.append(("overflow", "error", f"the prompt does not fit max_token_len={max_len} tokens even without an "
                                         f"instruction (state of {n_state} values): it is cut"))
    if fitted.new_cut:
        out.append(("truncated", "warning", f"observation {seq}: instruction of {original} characters cut to "
                    f"{fitted.kept} so that the prompt fits max_token_len={max_len} tokens (said once for this "
                    "instruction; instructions_truncated counts every observation)"))
    return out


def _longest_prefix(fits, length: int) -> int:
    """The largest n in 0..length with fits(n), given fits(0) (binary search)."""
    lo, hi = 0, length
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def fit_question(tokenizer: Tokenizer, text: str, limit: int) -> FittedQuestion:
    """A question's text cleaned; ``truncated`` when it is longer than ``limit`` tokens
    (the engine keeps the first ``limit``)."""
    cleaned = clean_text(text[:limit * CHARS_PER_TOKEN]).strip()
    if not cleaned:
        return FittedQuestion("", False, 0)
    tokens = len(tokenizer.encode(cleaned))
    return FittedQuestion(cleaned, tokens > limit or len(text) > limit * CHARS_PER_TOKEN, tokens)


def oversized_images(obs: Observation, size: int) -> str | None:
    """What to say when ``obs``'s images are at least twice the model's ``size`` (each is resized
    to it every frame, and its bytes crossed the middleware for nothing); None otherwise."""
    shapes = [img.shape[:2] for img in obs.images.values()]
    if not shapes or max(max(s) for s in shapes) < 2 * size:
        return None
    h, w = max(shapes, key=max)
    return (f"observations carry {w}x{h} images and the model takes {size}x{size}: each is resized every "
            f"frame; the camera node's image_size: {size} sends them at the model's size")
