"""oxygen-prefill-bench: our prefill against a plain PyTorch π0.5 prefill, same weights, one run.

The plain prefill is the one openpi's PyTorch π0.5 and LeRobot's ``pi05`` run:
SigLIP over every camera slot, transformers' ``GemmaModel`` over the padded
prefix (see ``oxygen_ros/core/plain_prefill.py``). The table gives each one's
median time, the positions its VLM computed and the time per position.

Example (the figures in the README)::

    oxygen-prefill-bench --preset pi05 --dtype bfloat16 --threads 2 --present 3 --prompt-tokens 20
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from ..core.model.vla import PrefixBatch
from ..core.plain_prefill import ATTENTION, compare_prefill
from .arguments import DefaultsHelp, non_negative_int, output_file, plain, positive_int, write_output
from .common import add_model_args, load_model


def attention_list(text: str) -> list[str]:
    values = [x for x in text.split(",") if x]
    if any(x not in ATTENTION for x in values):
        raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(ATTENTION)}, got {text!r}")
    return values


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="oxygen-prefill-bench", description=plain(__doc__.split("\n")[0]),
                                formatter_class=DefaultsHelp)
    p.add_argument("--present", type=positive_int, help="cameras present per observation (default: all slots)")
    p.add_argument("--prompt-tokens", type=positive_int, default=20, help="valid prompt tokens per observation")
    p.add_argument("--batch", type=positive_int, default=1, help="observations in the prefill")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed runs of each, interleaved")
    p.add_argument("--attention", type=attention_list, default=list(ATTENTION),
                   help="the plain prefill's transformers attention implementations (comma list)")
    p.add_argument("--padded", action="store_true",
                   help="also time ours without trimming (every camera slot, the padded prompt)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the random images and prompt tokens")
    p.add_argument("--json", type=output_file, help="write the results here")
    add_model_args(p)
    return p.parse_args(argv)


def make_batch(config, batch: int, present: int, prompt_tokens: int, seed: int) -> PrefixBatch:
    """``batch`` observations with random images in the first ``present`` camera slots and
    ``prompt_tokens`` valid prompt tokens (the rest of the prompt is padding)."""
    cams, length, size = config.max_cameras, config.max_token_len, config.vision.image_size
    if not 1 <= present <= cams:
        raise SystemExit(f"--present must be 1..{cams} (the model's camera slots), got {present}")
    if not 1 <= prompt_tokens <= length:
        raise SystemExit(f"--prompt-tokens must be 1..{length} (the model's max_token_len), got {prompt_tokens}")
    if batch < 1:
        raise SystemExit(f"--batch must be >= 1, got {batch}")
    gen = torch.Generator().manual_seed(seed)
    return PrefixBatch(
        pixels=torch.rand(batch, cams, 3, size, size, generator=gen) * 2 - 1,
        image_mask=(torch.arange(cams) < present).expand(batch, cams).clone(),
        tokens=torch.randint(0, config.vocab_size, (batch, length), generator=gen),
        token_mask=(torch.arange(length) < prompt_tokens).expand(batch, length).clone(),
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    loaded = load_model(args)
    model = loaded.model
    present = args.present if args.present is not None else model.config.max_cameras
    batch = make_batch(model.config, args.batch, present, args.prompt_tokens, args.seed)
    print(f"{model.config.name}, {args.dtype}, {args.threads} thread(s), {args.batch} x ({present} of "
          f"{model.config.max_cameras} cameras, {args.prompt_tokens} of {model.config.max_token_len} prompt tokens)",
          file=sys.stderr)
    timings, agreement = compare_prefill(model, batch, args.attention, args.repeats,
                                         lambda line: print(line, file=sys.stderr, flush=True), padded=args.padded)
    ours = timings[0]
    print("| prefill | positions | median ms | vs ours | ms / position | vs ours per position | logits vs ours |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for t in timings:
        diff = "" if t.name == "ours" else f"{agreement[t.name]:.1e}"
        print(f"| {t.name} | {t.positions} | {t.median_s * 1e3:.2f} | {t.median_s / ours.median_s:.2f}x | "
              f"{t.ms_per_position:.3f} | {t.ms_per_position / ours.ms_per_position:.2f}x | {diff} |")
    results = {
        "preset": model.config.name, "dtype": args.dtype, "threads": args.threads, "batch": args.batch,
        "present": present, "prompt_tokens": args.prompt_tokens,
        "runs": [{"name": t.name, "positions": t.positions, "median_s": t.median_s, "times_s": t.times_s,
                  "ms_per_position": t.ms_per_position} for t in timings],
        "logits_rel_diff": agreement,
    }
    if args.json and not write_output(args.json, json.dumps(results, indent=2) + "\n", "oxygen-prefill-bench"):
        return 1  # it said why, and printed the results on stdout
    return 0


if __name__ == "__main__":
    sys.exit(main())
