"""Write the tokenizer corpus and train the shipped SentencePiece model.

The corpus (``oxygen_ros/data/corpus.txt``) is text this project writes itself,
produced by :func:`build_corpus`, one sentence per line:

* every instruction and every description of the synthetic task
  (:mod:`oxygen_ros.core.sim.scene`), and every question it asks and every
  answer (:mod:`oxygen_ros.core.sim.questions`);
* the pi0.5 prompt scaffolding (``Task: ..., State: ...;`` and ``Action: ``)
  with every state bin 0..255, see :func:`oxygen_ros.core.tokenizer.format_prompt`;
* a few hundred short robot-style instructions, questions and answers written
  for this file (:data:`HANDWRITTEN`) and expanded from small templates.

Usage (from the repository root)::

    python -m oxygen_ros.tools.train_tokenizer --write-corpus   # regenerate corpus.txt
    python -m oxygen_ros.tools.train_tokenizer                  # corpus.txt -> tokenizer.model

Training is deterministic: one thread, no sentence sampling or shuffling, and
the model is written from memory so it does not record any file path; the same
corpus and options give a byte-identical model.
"""

from __future__ import annotations

import argparse
import io
import itertools
import pathlib
import sys
from collections.abc import Iterator, Sequence

from oxygen_ros.core.sim.questions import all_answers, all_questions
from oxygen_ros.core.sim.scene import COLOURS, SHAPES, all_descriptions, all_instructions
from oxygen_ros.tools.arguments import output_file

DATA_DIR = pathlib.Path(__file__).resolve().parent.parent / "data"
DEFAULT_CORPUS = DATA_DIR / "corpus.txt"
DEFAULT_MODEL = DATA_DIR / "tokenizer.model"
DEFAULT_VOCAB_SIZE = 512

#: Special token ids, PaliGemma-style: pad is 0.
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3

#: Short robot-style sentences written for this corpus.
HANDWRITTEN: tuple[str, ...] = (
    # instructions
    "pick up the cup",
    "pick up the red block",
    "pick up the blue cube and put it in the box",
    "place the cup on the table",
    "place it on the plate",
    "put the apple in the bowl",
    "put the spoon next to the plate",
    "open the drawer",
    "close the drawer",
    "open the gripper",
    "close the gripper",
    "open the door",
    "close the lid",
    "push the button",
    "press the green button",
    "turn the knob to the left",
    "slide the block to the right",
    "stack the yellow block on the blue block",
    "move the arm up",
    "move the arm down",
    "move left",
    "move right",
    "move forward",
    "move back",
    "go to the start position",
    "go home",
    "stop",
    "wait",
    "stop moving",
    "hold still",
    "release the object",
    "grasp the handle",
    "rotate the wrist",
    "lift the box slowly",
    "lower the arm carefully",
    "wipe the table",
    "fold the towel",
    "pour the water into the glass",
    "hand me the screwdriver",
    "bring the bottle to me",
    "follow the red circle",
    "point at the triangle",
    "touch the square",
    "clean up the table",
    "sort the blocks by colour",
    "put all the red objects on the left",
    "avoid the blue square",
    "move a little to the left",
    "move slightly up",
    "go back to where you started",
    # questions
    "what do you see?",
    "what is in front of you?",
    "what colour is the circle?",
    "what shape is the red object?",
    "where is the target?",
    "where is the gripper?",
    "where is the blue square?",
    "how many objects are there?",
    "how many circles do you see?",
    "is the gripper open?",
    "is the gripper closed?",
    "is the task done?",
    "did you reach the target?",
    "are you holding something?",
    "is there a yellow triangle?",
    "is the red circle left of the gripper?",
    "which object is closest to the gripper?",
    "what are you doing?",
    "what should you do next?",
    "can you pick it up?",
    "why did you stop?",
    "what is the state?",
    "describe the scene.",
    "describe the target.",
    # answers
    "yes",
    "no",
    "yes, it is",
    "no, it is not",
    "i do not know",
    "i am not sure",
    "i see a red circle and a blue square.",
    "i see a green triangle.",
    "i see three objects.",
    "there are two objects on the table.",
    "there is one object.",
    "the gripper is open.",
    "the gripper is closed.",
    "the gripper is empty.",
    "the gripper is holding the cup.",
    "the gripper is above the red circle.",
    "the gripper is at the target.",
    "the gripper is moving to the left.",
    "the target is the yellow square.",
    "the target is upper left of the gripper.",
    "the target is below the gripper.",
    "the task is done.",
    "the task is not done yet.",
    "i reached the target.",
    "i am moving to the green circle.",
    "i am picking up the cup.",
    "i stopped because the path is blocked.",
    "the drawer is open.",
    "the drawer is closed.",
    "the circle is red.",
    "the square is blue.",
    "the triangle is yellow.",
    "it is a green square.",
    "it is on the right.",
    "it is on the left.",
    "it is in the middle.",
    "it is near the top.",
    "it is near the bottom.",
    "nothing",
    "ok",
    "done",
    "ready",
    "moving",
    "failed",
    "error: target not found",
)

#: Words for the template part of the corpus.
_VERBS = ("move to", "go to", "pick up", "push", "touch", "point at", "look at", "grasp")
_EXTRA_COLOURS = ("orange", "purple", "white", "black", "grey", "pink", "brown")
_EXTRA_OBJECTS = ("cube", "block", "ball", "cup", "box", "bowl", "bottle", "star")
_DIRECTIONS = ("up", "down", "left", "right", "forward", "backward")
_AMOUNTS = ("a little", "a lot", "slowly", "quickly")


def _template_sentences() -> Iterator[str]:
    colours = tuple(COLOURS) + _EXTRA_COLOURS
    objects = SHAPES + _EXTRA_OBJECTS
    for k, (verb, colour) in enumerate(itertools.product(_VERBS, colours)):
        yield f"{verb} the {colour} {objects[k % len(objects)]}"
    for colour in colours:
        for obj in objects:
            yield f"is there a {colour} {obj}?"
            yield f"the {obj} is {colour}."
    for direction in _DIRECTIONS:
        for amount in _AMOUNTS:
            yield f"move {direction} {amount}"


def _prompt_sentences() -> Iterator[str]:
    """The pi0.5 prompt scaffolding with every state bin, 2 and 3 values per state.

    Every number 0..255 appears several times so that the trainer gives numbers
    compact encodings. The ``";\\nAction: "`` tail is split at the newline: the
    newline is a user-defined piece of its own.
    """
    instructions = all_instructions()
    for i in range(256):
        task = instructions[i % len(instructions)]
        a, b, c = i, (i * 97 + 31) % 256, (i * 53 + 200) % 256
        yield f"Task: {task}, State: {a} {b};"
        yield f"Task: {task}, State: {b} {c} {a};"
        yield f"State: {c} {a};"
        yield "Action: "


def build_corpus() -> list[str]:
    """The whole corpus, one sentence per entry, in a fixed order."""
    lines: list[str] = []
    lines += all_instructions()
    lines += all_descriptions()
    lines += all_questions()
    lines += all_answers()
    lines += HANDWRITTEN
    lines += _template_sentences()
    lines += _prompt_sentences()
    return lines


def write_corpus(path: pathlib.Path) -> None:
    """Write :func:`build_corpus` to ``path``, one sentence per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in build_corpus()), encoding="utf-8")


def read_corpus(path: pathlib.Path) -> list[str]:
    """The sentences of a corpus file (line ends removed, nothing else)."""
    text = path.read_text(encoding="utf-8")
    return [line for line in text.split("\n") if line]


def train(sentences: Sequence[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> bytes:
    """Train a BPE SentencePiece model on ``sentences`` and return its serialized bytes.

    Options follow the Gemma/PaliGemma tokenizer where they matter: identity
    normalisation, no dummy prefix, whitespace kept as is (so decode(encode(s))
    == s), byte fallback (any UTF-8 text encodes), ``"\\n"`` as a piece of its
    own (and ``";"``, see below), and ids pad=0, eos=1, bos=2, unk=3.
    """
    import sentencepiece  # imported here so --write-corpus works without it

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=1.0,
        byte_fallback=True,
        normalization_rule_name="identity",
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        split_digits=False,
        # Always pieces of their own: the newline of the prompt, and ";" so that
        # a state bin is tokenised the same whether or not it is the last one.
        user_defined_symbols=["\n", ";"],
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        bos_id=BOS_ID,
        unk_id=UNK_ID,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        num_threads=1,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        hard_vocab_limit=True,
        minloglevel=2,
    )
    return model.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corpus", type=pathlib.Path, default=DEFAULT_CORPUS, help="corpus file, one sentence per line"
    )
    parser.add_argument("--out", type=output_file, default=DEFAULT_MODEL, help="where to write the .model file")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    parser.add_argument(
        "--write-corpus",
        action="store_true",
        help="(re)generate the corpus file with build_corpus() and stop",
    )
    args = parser.parse_args(argv)
    if args.write_corpus:
        write_corpus(args.corpus)
        print(f"wrote {len(build_corpus())} sentences to {args.corpus}")
        return 0
    if not args.corpus.is_file():
        parser.error(f"corpus not found: {args.corpus} (generate it with --write-corpus)")
    proto = train(read_corpus(args.corpus), args.vocab_size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(proto)
    print(f"wrote {args.out} ({len(proto)} bytes, vocab {args.vocab_size})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
