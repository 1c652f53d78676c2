"""Questions of the synthetic task: their answers, their phrasings, and how training feeds them."""

import numpy as np
import pytest
import torch

from oxygen_ros.core import training
from oxygen_ros.core.model.config import TINY
from oxygen_ros.core.sim import questions
from oxygen_ros.core.sim import scene as sim
from oxygen_ros.core.tokenizer import Tokenizer
from oxygen_ros.tools.train_tokenizer import build_corpus


def _scene(gripper=(-0.3, -0.2)):
    objects = (sim.SceneObject("blue", "square", (-0.45, 0.4)), sim.SceneObject("red", "circle", (0.4, -0.35)),
               sim.SceneObject("red", "triangle", (0.3, 0.4)))
    return sim.Scene(objects, target_index=1, gripper=gripper)


def test_answers_follow_the_scene():
    scene = _scene()
    assert questions.answer(scene, "target") == "red circle"
    assert questions.answer(scene, "where") == "right of gripper"
    assert questions.answer(scene.with_gripper((0.4, 0.2)), "where") == "above gripper"
    assert [questions.answer(scene, "count", c) for c in ("red", "blue", "green")] == ["two", "one", "zero"]
    assert questions.answer(scene, "at_target") == "no"
    assert questions.answer(scene.with_gripper((0.45, -0.3)), "at_target") == "yes"
    assert questions.answer(scene.with_gripper((0.45, -0.3)), "where") == "at gripper"


def test_unknown_kind_or_colour_is_refused():
    with pytest.raises(ValueError, match="kind"):
        questions.answer(_scene(), "why")
    with pytest.raises(ValueError, match="colour"):
        questions.answer(_scene(), "count", "purple")


def test_ask_uses_every_phrasing_and_answers_it():
    rng = np.random.default_rng(0)
    scene = _scene()
    for kind in questions.KINDS:
        seen = {questions.ask(scene, kind, rng) for _ in range(200)}
        texts = {a.question for a in seen}
        assert len(texts) >= len(questions.PHRASINGS[kind]), (kind, texts)
        for a in seen:
            assert a.kind == kind
            assert a.answer in questions.all_answers()
            if kind != "count":
                assert a.answer == questions.answer(scene, kind)
        if kind == "count":  # colours of the scene and others: several answers come up
            assert {a.answer for a in seen} >= {"zero", "one", "two"}, seen


def test_every_question_and_answer_is_in_the_tokenizer_corpus():
    corpus = set(build_corpus())
    assert set(questions.all_questions()) <= corpus
    assert set(questions.all_answers()) <= corpus


def test_a_question_is_fed_after_the_prompt_and_only_its_answer_is_learned():
    tok = Tokenizer.default()
    examples = training.batch_examples(training.TrainConfig(batch_size=64, seed=4), 0, 48, TINY.action_horizon)
    asked = [e for e in examples if e.question]
    described = [e for e in examples if not e.question]
    assert asked and described, "a batch mixes questions and descriptions"
    assert {e.question.split()[0] for e in asked} >= {"what", "where", "how"}
    text_in, mask, targets = training.text_batch([asked[0], described[0]], tok)
    q, a = tok.encode(asked[0].question), tok.encode(asked[0].answer)
    assert text_in[0, : len(q) + len(a)].tolist() == q + a and int(mask[0].sum()) == len(q) + len(a)
    assert targets[0].tolist() == [-100] * len(q) + a + [tok.eos_id] + [-100] * (targets.shape[1] - len(q) - len(a) - 1)
    d = tok.encode(described[0].description)
    assert targets[1, : len(d) + 1].tolist() == d + [tok.eos_id]
    assert torch.all(targets[1, len(d) + 1:] == -100)


def test_count_asks_about_a_missing_colour_half_of_the_time():
    """"zero" must be learned as often as a colour that is there (a model trained on
    few of them answered "one" for colours the scene lacks)."""
    rng = np.random.default_rng(3)
    answers = [questions.ask(_scene(), "count", rng).answer for _ in range(2000)]
    assert 0.45 < answers.count("zero") / len(answers) < 0.55


def test_training_draws_question_kinds_in_their_configured_proportions():
    cfg = training.TrainConfig(batch_size=512, seed=1, question_prob=1.0, question_kind_weights=(1, 0, 3, 0))
    asked = [e.question for e in training.batch_examples(cfg, 0, 48, TINY.action_horizon)]
    counting = sum(q.startswith(("how many", "count the")) for q in asked)
    assert counting + sum(q.startswith(tuple(questions.PHRASINGS["target"])) for q in asked) == len(asked)
    assert 0.68 < counting / len(asked) < 0.82  # 3 of 4
    with pytest.raises(ValueError, match="question_kind_weights"):
        training.TrainConfig(question_kind_weights=(1.0, 1.0))


def test_training_answers_are_right_for_their_scenes():
    """The data never teaches a wrong answer: each asked example's answer is the one its
    gripper and target give (e.g. at_target asked with the gripper on the target half the time)."""
    examples = training.batch_examples(training.TrainConfig(batch_size=256, seed=1), 3, 48, TINY.action_horizon)
    at = [e for e in examples if e.question and e.answer in ("yes", "no")]
    assert {e.answer for e in at} == {"yes", "no"}
    for e in examples:
        if e.question.startswith("where is the target?"):
            assert e.description.endswith(e.answer)
        if e.question.startswith("what is the target?"):
            assert e.instruction == f"move to the {e.answer}"


def test_eval_scores_each_kind_by_its_exact_answers():
    from types import SimpleNamespace

    from oxygen_ros.tools.eval import held_out_scenes
    from oxygen_ros.tools.eval_questions import question_cases, summarise_questions

    cases = question_cases(held_out_scenes(10), seed=0)
    assert [a.kind for _, a in cases] == list(questions.KINDS) * 10
    at = [(s, a) for s, a in cases if a.kind == "at_target"]
    assert {a.answer for _, a in at} == {"yes", "no"}  # the gripper is put on the target in some
    assert all(a.answer == questions.answer(s, a.kind) for s, a in at)
    # right, except every "where" answer and one "count" answer
    said = [SimpleNamespace(text="wrong" if a.kind == "where" or (a.kind == "count" and i == 2) else a.answer)
            for i, (_, a) in enumerate(cases)]
    r = summarise_questions(cases, said)
    assert r["question_accuracy"] == {"target": 1.0, "where": 0.0, "count": 0.9, "at_target": 1.0}
    assert r["questions"] == {kind: 10 for kind in questions.KINDS}


def test_eval_counts_a_description_as_naming_the_target_only_with_its_colour_and_shape():
    from oxygen_ros.tools.eval import names_target

    scene = _scene()  # the target is the red circle; a red triangle is a distractor of its colour
    assert names_target("red circle upper right of gripper", scene)
    assert not names_target("red triangle lower right of gripper", scene)  # the distractor, not the target
    assert not names_target("blue circle upper right of gripper", scene)
    assert not names_target("red", scene)
