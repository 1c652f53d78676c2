"""Tests for oxygen_ros.core.tokenizer and the shipped SentencePiece model."""

from __future__ import annotations

import pathlib
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxygen_ros.core.sim.scene import all_descriptions, all_instructions
from oxygen_ros.core.tokenizer import (
    StreamDecoder,
    Tokenizer,
    default_tokenizer_path,
    discretize_state,
    format_prompt,
    tokenize_prompt,
)
from oxygen_ros.tools import train_tokenizer


# ---------------------------------------------------------------- loading


def test_missing_file_names_the_path(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "nope" / "tokenizer.model"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        Tokenizer(missing)


@pytest.mark.parametrize("content", [b"", b"this is not a sentencepiece model\n"])
def test_not_a_model_names_the_path(tmp_path: pathlib.Path, content: bytes) -> None:
    bad = tmp_path / "bad.model"
    bad.write_bytes(content)
    with pytest.raises(ValueError, match=str(bad)):
        Tokenizer(bad)


def test_directory_is_rejected(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match=str(tmp_path)):
        Tokenizer(tmp_path)


def test_shipped_model_ids(tok: Tokenizer) -> None:
    assert default_tokenizer_path().is_file()
    assert default_tokenizer_path().stat().st_size < 500_000
    assert tok.vocab_size == train_tokenizer.DEFAULT_VOCAB_SIZE == 512
    assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
    assert tok.encode("hi", bos=True)[0] == tok.bos_id
    assert tok.encode("hi", eos=True)[-1] == tok.eos_id
    assert tok.piece(tok.pad_id) == tok.piece(tok.bos_id) == tok.piece(tok.eos_id) == ""


# ---------------------------------------------------------------- encode / decode


def test_empty_text_encodes_to_nothing_but_the_markers_asked_for(tok: Tokenizer) -> None:
    """A request without a question encodes "": nothing, or only BOS / EOS when asked."""
    assert tok.encode("") == []
    assert tok.encode("", bos=True) == [tok.bos_id]
    assert tok.encode("", eos=True) == [tok.eos_id]
    assert tok.encode("", bos=True, eos=True) == [tok.bos_id, tok.eos_id]
    assert tok.decode(tok.encode("", bos=True, eos=True)) == ""


@pytest.mark.parametrize(
    "text",
    [
        "move to the red circle",
        "  leading and trailing spaces  ",
        "Task: pick up the cup, State: 12 255;\nAction: ",
        "tabs\tand\r\nwindows newlines",
        "héllo wörld",
        "日本語のテキスト ✓ 🤖",
    ],
)
def test_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.unk_id not in ids
    assert tok.decode(ids) == text
    assert tok.decode(np.asarray(ids)) == text


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\u2581"), max_size=40))
def test_round_trip_any_text(text: str) -> None:
    # U+2581 is SentencePiece's own space marker: it decodes as a space (a known
    # SentencePiece limitation), every other character round-trips.
    tok = Tokenizer(default_tokenizer_path())
    assert tok.decode(tok.encode(text)) == text


def test_non_ascii_uses_byte_fallback(tok: Tokenizer) -> None:
    ids = tok.encode("é")
    # U+00E9 is 0xC3 0xA9 in UTF-8; neither is a learned piece.
    assert [tok.piece_bytes(i) for i in ids] == [b"\xc3", b"\xa9"]


def test_text_that_is_not_utf8_is_refused_naming_where(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="lone surrogate at character 5"):
        tok.encode("move \ud800 left")


def test_decode_skips_control_tokens(tok: Tokenizer) -> None:
    ids = [tok.bos_id] + tok.encode("open the drawer") + [tok.eos_id, tok.pad_id, tok.pad_id]
    assert tok.decode(ids) == "open the drawer"


def test_decode_rejects_out_of_range_ids(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="out of range"):
        tok.piece(-1)
    with pytest.raises(ValueError, match="token ids must be integers, got float64"):
        tok.decode([1.7])  # was read as 1 (EOS)
    assert tok.decode([]) == "" and tok.decode(np.array([], dtype=np.float32)) == ""


@pytest.mark.parametrize("text", ["the gripper is open.", " what do you see?\n", "Action: "])
def test_pieces_concatenate_to_decoded_text(tok: Tokenizer, text: str) -> None:
    ids = [tok.bos_id] + tok.encode(text) + [tok.eos_id]
    assert "".join(tok.piece(i) for i in ids) == tok.decode(ids) == text


def test_newline_is_one_piece(tok: Tokenizer) -> None:
    assert len(tok.encode("\n")) == 1
    assert tok.piece(tok.encode("\n")[0]) == "\n"
    assert tok.piece(tok.encode(" the")[0]) == " the"


@pytest.mark.parametrize("text", ["héllo wörld ✓ 日本 the gripper", "🤖 ok", "plain"])
def test_stream_decoder_handles_split_characters(tok: Tokenizer, text: str) -> None:
    stream = StreamDecoder(tok)
    chunks = [stream.push(i) for i in tok.encode(text)]
    assert "".join(chunks) + stream.flush() == text == tok.decode(tok.encode(text))
    assert "\ufffd" not in "".join(chunks)


# ---------------------------------------------------------------- pi0.5 prompt


def test_state_discretisation_known_values() -> None:
    state = [-1.0, -0.99, 0.0, 0.5, 0.99, 0.999, 1.0, -7.0, 7.0]
    # Bin k covers [-1 + k/128, -1 + (k+1)/128); 1.0 and above fall in the last bin, below -1 in
    # bin -1 (openpi's and LeRobot's np.digitize - 1, unclipped: the token π0.5 was trained on)
    assert discretize_state(state).tolist() == [0, 1, 128, 192, 254, 255, 255, -1, 255]
    assert discretize_state(np.float32([-1.0, 0.0, 0.999])).dtype.kind == "i"


def test_state_discretisation_matches_openpi_formula() -> None:
    values = np.random.default_rng(0).uniform(-1.5, 1.5, size=1000)  # a sixth outside [-1, 1]
    expected = np.digitize(values, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    np.testing.assert_array_equal(discretize_state(values), expected)
    assert discretize_state(values).min() == -1 and discretize_state(values).max() == 255


def test_non_finite_state_is_rejected() -> None:
    with pytest.raises(ValueError, match="finite"):
        discretize_state([0.0, float("nan")])


def test_prompt_with_state_exact_format() -> None:
    prompt = format_prompt("  move_to the\nred circle ", np.array([-1.0, 0.0, 0.999]))
    assert prompt == "Task: move to the red circle, State: 0 128 255;\nAction: "


def test_prompt_without_state() -> None:
    assert format_prompt(" pick_up the cup\n", None) == "pick up the cup"


def test_tokenize_prompt_with_state(tok: Tokenizer) -> None:
    ids, mask = tokenize_prompt(tok, "move to the red circle", [0.1, -0.2], max_len=48)
    assert ids.shape == mask.shape == (48,)
    assert ids.dtype == np.int64 and mask.dtype == np.bool_
    n = int(mask.sum())
    assert mask[:n].all() and not mask[n:].any()
    assert (ids[n:] == tok.pad_id).all()
    expected = tok.encode("Task: move to the red circle, State: 140 102;\nAction: ", bos=True)
    assert ids[:n].tolist() == expected
    assert ids[0] == tok.bos_id
    assert tok.decode(ids) == "Task: move to the red circle, State: 140 102;\nAction: "


def test_tokenize_prompt_without_state(tok: Tokenizer) -> None:
    ids, mask = tokenize_prompt(tok, "open_the drawer", None, max_len=16)
    expected = tok.encode("open the drawer", bos=True) + tok.encode("\n")
    assert ids[mask].tolist() == expected
    assert ids[: len(expected)].tolist() == expected
    assert tok.decode(ids) == "open the drawer\n"


def test_tokenize_prompt_truncates_with_warning(tok: Tokenizer) -> None:
    full = tok.encode(format_prompt("move to the red circle", [0.5, 0.5]), bos=True)
    with pytest.warns(UserWarning, match="truncat"):
        ids, mask = tokenize_prompt(tok, "move to the red circle", [0.5, 0.5], max_len=5)
    assert ids.tolist() == full[:5]
    assert mask.all() and mask.shape == (5,)


def test_tokenize_prompt_exact_fit_does_not_warn(tok: Tokenizer) -> None:
    n = len(tok.encode(format_prompt("move to the red circle", [0.5, 0.5]), bos=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _ids, mask = tokenize_prompt(tok, "move to the red circle", [0.5, 0.5], max_len=n)
    assert mask.all()


# ---------------------------------------------------------------- compactness of the shipped model


def test_synthetic_prompt_is_short(tok: Tokenizer) -> None:
    rng = np.random.default_rng(0)
    lengths = [
        int(tokenize_prompt(tok, instr, rng.uniform(-1, 1, size=2), max_len=64)[1].sum())
        for instr in all_instructions()
        for _ in range(20)
    ]
    assert max(lengths) <= 20


def test_state_bins_are_compact(tok: Tokenizer) -> None:
    for b in range(256):
        assert len(tok.encode(f" {b}")) <= 2, b


def test_task_text_uses_learned_pieces(tok: Tokenizer) -> None:
    assert max(len(tok.encode(d)) for d in all_descriptions()) <= 6
    assert max(len(tok.encode(i)) for i in all_instructions()) <= 5
    assert sum(tok.is_byte(i) for i in range(tok.vocab_size)) == 256
    for text in all_instructions() + all_descriptions():
        assert not any(tok.is_byte(i) for i in tok.encode(text)), text


# ---------------------------------------------------------------- reproducibility of the shipped files


def test_shipped_corpus_is_build_corpus() -> None:
    assert train_tokenizer.read_corpus(train_tokenizer.DEFAULT_CORPUS) == train_tokenizer.build_corpus()


def test_retraining_gives_byte_identical_model(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "retrained.model"
    rc = train_tokenizer.main(
        ["--corpus", str(train_tokenizer.DEFAULT_CORPUS), "--out", str(out), "--vocab-size", "512"]
    )
    assert rc == 0
    assert out.read_bytes() == default_tokenizer_path().read_bytes()


def test_write_corpus_round_trip(tmp_path: pathlib.Path) -> None:
    corpus = tmp_path / "corpus.txt"
    assert train_tokenizer.main(["--write-corpus", "--corpus", str(corpus)]) == 0
    assert corpus.read_bytes() == train_tokenizer.DEFAULT_CORPUS.read_bytes()
