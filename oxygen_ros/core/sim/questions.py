"""Questions about a scene of the reach task, with the answers the image and the state determine.

Four kinds (:data:`KINDS`), each phrased in several ways (:data:`PHRASINGS`):

* ``target``: what the target is -> ``"red circle"``;
* ``where``: where the target is relative to the gripper -> a relation of
  :func:`~oxygen_ros.core.sim.scene.relation`, ``"upper left of gripper"``;
* ``count``: how many objects of a colour there are -> ``"zero"`` .. ``"three"``;
* ``at_target``: whether the gripper is at the target -> ``"yes"`` / ``"no"``
  (within :data:`~oxygen_ros.core.sim.scene.REACH_TOLERANCE`, the same reach as
  "at gripper" in a description and as success in the closed loop).

A question is asked the way serving asks it: its text goes after the prompt
(``/oxygen/question``, the Ask action) and the model decodes the answer and EOS
from there. :func:`ask` draws one for a scene; :func:`all_questions` and
:func:`all_answers` list every text (for the tokenizer's corpus).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from oxygen_ros.core.sim.scene import COLOURS, REACH_TOLERANCE, RELATIONS, SHAPES, Scene, relation

KINDS: tuple[str, ...] = ("target", "where", "count", "at_target")

#: The phrasings of each kind; ``{name}`` is the target's name, ``{colour}`` the colour asked about.
PHRASINGS: dict[str, tuple[str, ...]] = {
    "target": (
        "what is the target?",
        "which object is the target?",
        "what are you moving to?",
        "what should you reach?",
    ),
    "where": (
        "where is the target?",
        "where is the target relative to the gripper?",
        "where is the {name}?",
        "which way is the {name}?",
    ),
    "count": (
        "how many {colour} objects are there?",
        "how many {colour} objects do you see?",
        "how many objects are {colour}?",
        "count the {colour} objects.",
    ),
    "at_target": (
        "is the gripper at the target?",
        "have you reached the target?",
        "is the target reached?",
        "are you at the {name}?",
    ),
}

#: ``count`` answers, by number of objects.
NUMBERS: tuple[str, ...] = ("zero", "one", "two", "three")


class Asked(NamedTuple):
    """One question about a scene and its answer."""

    kind: str
    question: str
    answer: str


def answer(scene: Scene, kind: str, colour: str = "") -> str:
    """The answer to a question of ``kind`` about ``scene`` (``colour``: the one ``count`` asks about)."""
    if kind == "target":
        return scene.target.name
    if kind == "where":
        return relation(np.subtract(scene.target.position, scene.gripper))
    if kind == "count":
        if colour not in COLOURS:
            raise ValueError(f"count needs a colour of {sorted(COLOURS)}, got {colour!r}")
        return NUMBERS[sum(o.colour == colour for o in scene.objects)]
    if kind == "at_target":
        return "yes" if math.dist(scene.gripper, scene.target.position) <= REACH_TOLERANCE else "no"
    raise ValueError(f"unknown question kind {kind!r}; expected one of {list(KINDS)}")


def ask(scene: Scene, kind: str, rng: np.random.Generator) -> Asked:
    """A question of ``kind`` about ``scene`` in a random phrasing, with its answer.

    ``count`` asks about the colour of one of the scene's objects half of the
    time, else about a colour the scene does not have (answer ``"zero"``).
    """
    phrasing = PHRASINGS[kind][int(rng.integers(len(PHRASINGS[kind])))]
    colour = ""
    if kind == "count":
        present = [o.colour for o in scene.objects]
        absent = [c for c in COLOURS if c not in present]
        pick = present if rng.random() < 0.5 or not absent else absent
        colour = pick[int(rng.integers(len(pick)))]
    text = phrasing.format(name=scene.target.name, colour=colour)
    return Asked(kind, text, answer(scene, kind, colour))


def all_questions() -> list[str]:
    """Every question text, in a fixed order."""
    names = [f"{c} {s}" for c in COLOURS for s in SHAPES]
    out: list[str] = []
    for kind in KINDS:
        for phrasing in PHRASINGS[kind]:
            texts = [phrasing.format(name=n, colour="") for n in names] if "{name}" in phrasing else \
                [phrasing.format(name="", colour=c) for c in COLOURS] if "{colour}" in phrasing else [phrasing]
            out += texts
    return out


def all_answers() -> list[str]:
    """Every answer text, in a fixed order."""
    names = [f"{c} {s}" for c in COLOURS for s in SHAPES]
    return names + list(RELATIONS) + list(NUMBERS) + ["yes", "no"]


__all__ = ["KINDS", "NUMBERS", "PHRASINGS", "Asked", "all_answers", "all_questions", "answer", "ask"]
