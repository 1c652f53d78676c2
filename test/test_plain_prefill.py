"""Our prefill against the plain PyTorch π0.5 prefill (transformers' Gemma over the padded prefix).

Both must compute the same function, or the per-position comparison of
``oxygen-prefill-bench`` would compare two different models.
"""

import json

import pytest
import torch

from oxygen_ros.core.model.config import TINY
from oxygen_ros.core.model.vla import PrefixBatch, build_model
from oxygen_ros.core.plain_prefill import compare_prefill, plain_language_model, plain_prefill
from oxygen_ros.tools import prefill_bench


def _batch(image_mask, prompt_lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    b, cams = len(image_mask), len(image_mask[0])
    size, length = TINY.vision.image_size, TINY.max_token_len
    return PrefixBatch(pixels=torch.rand(b, cams, 3, size, size, generator=gen) * 2 - 1,
                       image_mask=torch.tensor(image_mask, dtype=torch.bool),
                       tokens=torch.randint(0, TINY.vocab_size, (b, length), generator=gen),
                       token_mask=torch.arange(length)[None, :] < torch.tensor(prompt_lengths)[:, None])


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("image_mask,prompt_lengths", [
    ([[1, 1, 1]], [32]),  # every slot valid: our attention runs without a mask
    ([[1, 0, 1], [1, 1, 0]], [9, 14]),  # absent cameras, prompts of different lengths
    ([[0, 1, 0]], [3]),
])
def test_our_prefill_gives_the_plain_prefills_logits(attention, image_mask, prompt_lengths):
    model = build_model(TINY, seed=3)
    batch = _batch(image_mask, prompt_lengths)
    cache = model.new_cache(len(image_mask), 128)
    ours = model.prefill(batch, cache, [[i] for i in range(batch.size)]).logits
    plain = plain_prefill(model, plain_language_model(model, attention), batch)
    assert torch.allclose(ours, plain, atol=1e-5, rtol=1e-5), (ours - plain).abs().max()


def test_the_plain_model_shares_the_weights_instead_of_copying_them():
    model = build_model(TINY)
    gemma = plain_language_model(model, "eager")
    assert gemma.layers[0].mlp.up_proj.weight.data_ptr() == model.language_model.layers[0].mlp.up_proj.weight.data_ptr()


def test_compare_counts_the_positions_each_prefill_computes():
    model = build_model(TINY)
    timings, agreement = compare_prefill(model, _batch([[1, 0, 1]], [5]), ["sdpa"], repeats=2, padded=True)
    by_name = {t.name: t for t in timings}
    tokens = TINY.vision.tokens_per_image
    assert by_name["ours"].positions == 2 * tokens + 5  # valid tokens only
    every = 3 * tokens + TINY.max_token_len  # every slot, padded prompt
    assert by_name["plain_sdpa"].positions == every and by_name["ours_padded"].positions == every
    assert len(by_name["ours"].times_s) == 2
    assert agreement["plain_sdpa"] < 1e-5 and agreement["ours_padded"] < 1e-5


def test_the_command_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "prefill.json"
    assert prefill_bench.main(["--preset", "tiny", "--present", "2", "--prompt-tokens", "7", "--repeats", "1",
                               "--attention", "eager", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| ours |" in table and "| plain_eager |" in table
    result = json.loads(out.read_text())
    assert [r["name"] for r in result["runs"]] == ["ours", "plain_eager"]
    assert result["present"] == 2 and result["prompt_tokens"] == 7
    assert result["logits_rel_diff"]["plain_eager"] < 1e-5
    # milliseconds with two decimals: in seconds, every row of the default model read 0.003
    ours_row = next(line for line in table.splitlines() if line.startswith("| ours |"))
    assert "| median ms |" in table and ours_row.split("|")[3].strip() == f"{result['runs'][0]['median_s'] * 1e3:.2f}"


@pytest.mark.parametrize("argv,message", [
    (["--present", "4"], "--present must be 1..3"),
    (["--prompt-tokens", "33"], "--prompt-tokens must be 1..32"),
])
def test_the_command_names_a_bad_option(argv, message):
    with pytest.raises(SystemExit, match=message):
        prefill_bench.main(["--preset", "tiny", "--repeats", "1"] + argv)


@pytest.mark.parametrize("option", ["--present", "--prompt-tokens", "--batch", "--repeats"])
def test_a_count_below_one_is_refused_before_the_model_loads(option, capsys):
    with pytest.raises(SystemExit) as exit_:
        prefill_bench.parse_args([option, "0"])
    assert exit_.value.code == 2 and f"argument {option}: expected an integer >= 1, got '0'" in capsys.readouterr().err


def test_the_command_refuses_an_unknown_attention(capsys):
    with pytest.raises(SystemExit):
        prefill_bench.main(["--preset", "tiny", "--attention", "flash"])
    assert "expected a comma list of eager, sdpa" in capsys.readouterr().err
