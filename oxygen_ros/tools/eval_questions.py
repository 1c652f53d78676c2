"""``question_accuracy`` of ``oxygen-eval``: held-out questions of every kind, asked as serving asks them.

Every held-out scene is asked one question of each kind of
:mod:`oxygen_ros.core.sim.questions`, in a phrasing drawn from the
evaluation seed; an ``at_target`` question finds the gripper on the target
in about half of the scenes (:func:`~oxygen_ros.core.sim.gripper_near_target`),
so both answers come up. A question is a :class:`Question` to the engine, as
``/oxygen/question`` and the Ask action make it: its text goes after the
prefix of its scene's observation, and the answer is what the request decodes.
An answer is right when it is exactly the expected text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..core.engine import Engine, Question
from ..core.observation import Observation, resize_with_pad
from ..core.sim import gripper_near_target, questions
from ..core.sim import scene as sim
from ..core.training import EVAL_SEED_BASE

CAMERA = "base"
#: The generator stream of the questions, beside that of the scenes.
QUESTION_STREAM = 17


def question_cases(scenes: Sequence[sim.Scene], seed: int = 0) -> list[tuple[sim.Scene, questions.Asked]]:
    """One question of every kind per scene (``at_target``: the gripper on the target half the time)."""
    rng = np.random.default_rng([EVAL_SEED_BASE + seed, QUESTION_STREAM])
    cases = []
    for scene in scenes:
        for kind in questions.KINDS:
            asked_about = scene
            if kind == "at_target" and rng.random() < 0.5:
                asked_about = gripper_near_target(scene, rng)
            cases.append((asked_about, questions.ask(asked_about, kind, rng)))
    return cases


def ask_all(engine: Engine, cases: Sequence[tuple[sim.Scene, questions.Asked]], *, image_size: int,
            concurrency: int, camera_size: int | None = None) -> list:
    """The finished request of every case, in order: ``concurrency`` scenes a frame, each its own
    robot, each asked its question on the observation of that frame."""
    done: dict[str, object] = {}
    for start in range(0, len(cases), concurrency):
        part = cases[start:start + concurrency]
        names = [f"q{start + i}" for i in range(len(part))]
        observations = [scene_observation(scene, image_size, camera_size) for scene, _ in part]
        asked = [Question(a.question, client_id=n, robot=n) for n, (_, a) in zip(names, part)]
        result = engine.step(observations, asked, robots=names, start_language=False)
        for r in result.finished + engine.drain():
            done[r.client_id] = r
        engine.forget_observations()
    return [done[f"q{i}"] for i in range(len(cases))]


def scene_observation(scene: sim.Scene, image_size: int, camera_size: int | None = None) -> Observation:
    """``scene`` rendered at ``image_size`` as the one camera's image; with ``camera_size``, resized to
    it first as the camera node does (``image_size`` there), so the model sees what it sees in the agent."""
    image = sim.render(scene, image_size)
    if camera_size:
        image = resize_with_pad(image, camera_size)
    return Observation(images={CAMERA: image}, instruction=scene.instruction, state=scene.state)


def summarise_questions(cases: Sequence[tuple[sim.Scene, questions.Asked]], requests: Sequence) -> dict:
    """``question_accuracy`` per kind (and over all), and the number of questions of each kind."""
    right: dict[str, list[bool]] = {kind: [] for kind in questions.KINDS}
    for (_, asked), request in zip(cases, requests):
        right[asked.kind].append(request.text.strip() == asked.answer)
    every = [ok for oks in right.values() for ok in oks]
    return {"question_accuracy": {kind: float(np.mean(oks)) for kind, oks in right.items() if oks},
            "question_accuracy_all": float(np.mean(every)) if every else None,
            "questions": {kind: len(oks) for kind, oks in right.items()}}


__all__ = ["CAMERA", "ask_all", "question_cases", "scene_observation", "summarise_questions"]
