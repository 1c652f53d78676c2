"""SentencePiece tokenizer and the pi0.5 prompt format.

:class:`Tokenizer` wraps a SentencePiece model (by default the small one shipped
in ``oxygen_ros/data/tokenizer.model``, see ``oxygen_ros/data/README.md``).
:func:`format_prompt` and :func:`tokenize_prompt` build the model's language
input the way openpi's ``PaligemmaTokenizer`` does for pi0.5:

* the instruction is cleaned (stripped, ``_`` and newlines become spaces);
* with a state, each value is clipped to ``[-1, 1]`` and discretised into 256
  bins and the prompt is ``"Task: {instruction}, State: {bins};\\nAction: "``,
  encoded with BOS;
* without a state, the tokens are ``encode(instruction, bos=True) + encode("\\n")``;
* the ids are right-padded with the pad id (0) to ``max_len`` with a boolean
  mask, or truncated with a warning.
"""

from __future__ import annotations

import bisect
import codecs
import math
import os
import pathlib
import warnings
from collections.abc import Iterable

import numpy as np
import sentencepiece

#: Number of bins a state value is discretised into.
STATE_BINS = 256


def default_tokenizer_path() -> pathlib.Path:
    """The SentencePiece model shipped with the package (``oxygen_ros/data/tokenizer.model``)."""
    return pathlib.Path(__file__).resolve().parent.parent / "data" / "tokenizer.model"


class Tokenizer:
    """A SentencePiece model with the ids and helpers the VLA model needs.

    Attributes ``vocab_size``, ``bos_id``, ``eos_id`` and ``pad_id`` come from the
    model; ``pad_id`` falls back to 0 (as in PaliGemma) for a model without one.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"tokenizer model not found: {self.path}")
        if not self.path.is_file():
            raise ValueError(f"tokenizer model is not a file: {self.path}")
        data = self.path.read_bytes()
        self._sp = sentencepiece.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(data)
        except Exception as exc:  # sentencepiece raises RuntimeError / OSError
            raise ValueError(f"not a SentencePiece model: {self.path} ({exc})") from exc
        if self._sp.vocab_size() <= 0:
            raise ValueError(f"not a SentencePiece model (empty vocabulary): {self.path}")
        if self._sp.bos_id() < 0 or self._sp.eos_id() < 0:
            raise ValueError(f"SentencePiece model without BOS/EOS ids: {self.path}")
        self.vocab_size: int = int(self._sp.vocab_size())
        self.bos_id: int = int(self._sp.bos_id())
        self.eos_id: int = int(self._sp.eos_id())
        self.pad_id: int = int(self._sp.pad_id()) if self._sp.pad_id() >= 0 else 0
        self.unk_id: int = int(self._sp.unk_id())
        self._piece_bytes: dict[int, bytes] = {}  # each id's, the first time it is streamed

    @classmethod
    def default(cls) -> Tokenizer:
        """The tokenizer shipped with the package, see :func:`default_tokenizer_path`."""
        return cls(default_tokenizer_path())

    def __repr__(self) -> str:
        return f"Tokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """Token ids of ``text``, optionally with BOS first and/or EOS last."""
        if not text:  # a request without a question: SentencePiece's call costs some 15 us even so
            return [self.bos_id] * bos + [self.eos_id] * eos
        try:
            return list(self._sp.encode(text, out_type=int, add_bos=bos, add_eos=eos))
        except RuntimeError:  # SentencePiece's binding cannot take a str that is not valid UTF-8
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"text is not valid UTF-8 (a lone surrogate at character {exc.start}); "
                                 "oxygen_ros.core.text.clean_text replaces it") from None
            raise

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """The text of ``ids``; control tokens (pad, BOS, EOS) contribute nothing."""
        arr = np.asarray(ids)
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"token ids must be integers, got {arr.dtype} ({arr.reshape(-1)[:3].tolist()}...)")
        return self._sp.decode([self._check_id(i) for i in arr.astype(np.int64).reshape(-1).tolist()])

    def piece_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes this token contributes to decoded text.

        Empty for control tokens, one raw byte for a byte-fallback token, and
        the piece with ``"▁"`` turned into a space otherwise. Kept per id: a frame
        streams each token's piece, which took four calls into SentencePiece.
        """
        known = self._piece_bytes.get(token_id)
        if known is None:
            token_id = self._check_id(token_id)
            known = self._piece_bytes[token_id] = self._read_piece_bytes(token_id)
        return known

    def _read_piece_bytes(self, token_id: int) -> bytes:
        if self._sp.is_control(token_id):
            return b""
        if self._sp.is_byte(token_id):
            return bytes([int(self._sp.id_to_piece(token_id)[1:-1], 16)])
        if self._sp.is_unknown(token_id):
            return self._sp.decode([token_id]).encode("utf-8")
        return self._sp.id_to_piece(token_id).replace("\u2581", " ").encode("utf-8")

    def piece(self, token_id: int) -> str:
        """The text this token contributes when streamed (``"▁"`` -> ``" "``).

        Concatenating the pieces of an encoding gives the decoded text, except
        that a byte-fallback token holding part of a multi-byte character reads
        as U+FFFD on its own; :class:`StreamDecoder` streams such text exactly.
        """
        return self.piece_bytes(token_id).decode("utf-8", errors="replace")

    def is_byte(self, token_id: int) -> bool:
        """Whether this is a byte-fallback token (``<0xNN>``)."""
        return bool(self._sp.is_byte(self._check_id(token_id)))

    def _check_id(self, token_id: int) -> int:
        token_id = int(token_id)
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} out of range [0, {self.vocab_size})")
        return token_id


_UTF8_DECODER = codecs.getincrementaldecoder("utf-8")  # looked up once: a request starts a decoder


class StreamDecoder:
    """Turns a stream of token ids into text as it arrives.

    ``push`` returns the text completed by one more token (possibly ``""`` while
    a multi-byte character is still incomplete); the concatenation of all
    ``push`` results and ``flush()`` equals ``tok.decode(ids)`` for valid text.
    """

    def __init__(self, tok: Tokenizer) -> None:
        self._tok = tok
        self._utf8 = _UTF8_DECODER(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self._tok.piece_bytes(token_id))

    def flush(self) -> str:
        """Whatever is left (U+FFFD for a truncated character); resets the decoder."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text


def normalize_instruction(instruction: str) -> str:
    """The instruction as π0.5 saw it in training: stripped, ``_`` and newlines replaced
    by spaces (as openpi does). Input text is cleaned before, by
    :func:`oxygen_ros.core.text.clean_text`."""
    return instruction.strip().replace("_", " ").replace("\n", " ")


def discretize_state(state: np.ndarray | Iterable[float]) -> np.ndarray:
    """Bin indices of ``state`` in pi0.5's 256 uniform bins over ``[-1, 1]``, exactly as openpi
    and LeRobot compute them (no clipping):

    ``np.digitize(state, np.linspace(-1, 1, 257)[:-1]) - 1``: -1 -> 0, 0 -> 128, values from
    ``1 - 2/256`` up -> 255, values below -1 (a normalised state under its 1st percentile) -> -1.
    """
    return np.array(state_bins(state), dtype=np.int64)


def state_bins(state: np.ndarray | Iterable[float]) -> list[int]:
    """:func:`discretize_state` as a list. Binned on the host, value by value (``bisect`` over the
    edges, exactly ``np.digitize``): a frame's prompt then costs no NumPy call, each of which
    took several microseconds in a frame, where the interpreter runs cold between the graphs."""
    flat = state if isinstance(state, np.ndarray) else np.asarray(state, dtype=np.float64)
    values = flat.reshape(-1).tolist()
    if not all(map(math.isfinite, values)):
        raise ValueError(f"state must be finite, got {flat}")
    return [bisect.bisect_right(_STATE_EDGES, v) - 1 for v in values]  # below -1: -1; 1 - 2/256 and above: 255


_STATE_EDGES = np.linspace(-1.0, 1.0, STATE_BINS + 1)[:-1].tolist()  # the bins' lower edges


def format_prompt(instruction: str, state: np.ndarray | Iterable[float] | None) -> str:
    """The prompt text (BOS and, without a state, the ``"\\n"`` tokens are added when encoding).

    With a state: ``"Task: {cleaned}, State: {b0} {b1} ...;\\nAction: "``;
    without: the cleaned instruction.
    """
    cleaned = normalize_instruction(instruction)
    if state is None:
        return cleaned
    bins = " ".join(map(str, state_bins(state)))
    return f"Task: {cleaned}, State: {bins};\nAction: "


def prompt_ids(tok: Tokenizer, instruction: str, state: np.ndarray | Iterable[float] | None) -> list[int]:
    """The unpadded token ids of the prompt, see :func:`format_prompt`."""
    text = format_prompt(instruction, state)
    if state is None:
        return tok.encode(text, bos=True) + tok.encode("\n")
    return tok.encode(text, bos=True)


def fitted_prompt_ids(tok: Tokenizer, instruction: str, state: np.ndarray | Iterable[float] | None,
                      max_len: int) -> list[int]:
    """:func:`prompt_ids` cut to ``max_len`` tokens, with a warning (never an error)."""
    if max_len <= 0:
        raise ValueError(f"max_len must be > 0, got {max_len}")
    ids = prompt_ids(tok, instruction, state)
    if len(ids) > max_len:
        message = f"prompt has {len(ids)} tokens, truncating to max_len={max_len}: {instruction!r}"
        warnings.warn(message, stacklevel=3)  # the caller of tokenize_prompt or make_prefix_batch
        ids = ids[:max_len]
    return ids


def tokenize_prompt(
    tok: Tokenizer,
    instruction: str,
    state: np.ndarray | Iterable[float] | None,
    max_len: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Prompt ids ``int64[max_len]`` and mask ``bool[max_len]`` (True on real tokens).

    Right-padded with ``tok.pad_id``; a prompt longer than ``max_len`` is cut to
    ``max_len`` tokens with a warning (never an error).
    """
    ids = fitted_prompt_ids(tok, instruction, state, max_len)
    tokens = np.full(max_len, tok.pad_id, dtype=np.int64)
    mask = np.zeros(max_len, dtype=bool)
    tokens[: len(ids)] = ids
    mask[: len(ids)] = True
    return tokens, mask
