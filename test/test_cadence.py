"""The language cadence: every n-th observation frame starts a language request."""

import numpy as np
import pytest

from oxygen_ros.core.cadence import LanguageCadence
from oxygen_ros.core.engine import Engine, EngineConfig
from oxygen_ros.core.observation import Observation
from oxygen_ros.core.tokenizer import Tokenizer


def test_every_nth_observation_frame_and_language_only_frames_do_not_count():
    c = LanguageCadence(2)
    assert [c.next(obs) for obs in (True, False, True, False, True, True)] == [True, False, False, False, True,
                                                                              False]
    assert not any(LanguageCadence(0).next(True) for _ in range(3))
    with pytest.raises(ValueError, match="language_every_n_frames"):
        LanguageCadence(-1)


def test_the_engine_uses_the_same_rule_without_a_plan(lively_tiny):
    engine = Engine(lively_tiny, Tokenizer.default(), EngineConfig(language_every_n_frames=2, max_decode=30))
    obs = [Observation({"base": np.zeros((32, 32, 3), np.uint8)}, "go left")]
    started = [len(engine.step(obs, decode_steps=0).started) for _ in range(2)]
    engine.step(decode_steps=1)  # a language-only frame: not counted
    started += [len(engine.step(obs, decode_steps=0).started) for _ in range(2)]
    assert started == [1, 0, 1, 0]
    assert len(engine.step(obs, start_language=True, decode_steps=0).started) == 1  # a plan decides
