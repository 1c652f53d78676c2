"""Which waiting questions a frame can take, and why the others are refused.

A question is refused (its client hears ``rejected``) when it has no client id
(its answer would look like a periodic description), no text, asks
for more tokens than ``max_decode``, or has nothing to be answered from: no
observation of its robot yet (or none usable: every one was refused), or only
one older than ``max_observation_age``, its camera stopped (an answer from it
would describe the past as the present). One in this very frame is always
fresh. A question over ``max_question_tokens`` is cut, not refused. Each
outcome is counted on its robot and logged (throttled by the caller's ``warn``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .chunk_clock import NS_PER_S
from .engine import Engine, Question
from .frame_result import tokens_beyond
from .input_fit import FittedQuestion, fit_question
from .robot_inputs import RobotInputs, WaitingQuestion

Warn = Callable[[str, str], None]  # (throttle key, text)
#: Why a question without a client id is refused: its answer's TextTokens would carry the empty
#: client id of the periodic descriptions, and no client could tell them apart.
NO_CLIENT_ID = ("no client_id: its answer would look like a periodic description (whose client_id is empty); give "
                "each question an id of its own")


@dataclass(frozen=True)
class QuestionIntake:
    """What a frame's question intake checks against: the engine (tokenizer, limits, the
    observations it would answer from), each robot's inputs, the age limit and the log."""

    engine: Engine
    robot: Callable[[str], RobotInputs]
    max_observation_age: float  # s; <= 0: no age check
    warn: Warn

    def take(self, questions: Iterable[WaitingQuestion], observed: Iterable[str], now_ros_ns: int = 0
             ) -> tuple[list[Question], list[WaitingQuestion]]:
        """(accepted, refused) of ``questions``; ``observed``: the robots with an observation in
        this frame; ``now_ros_ns``: the owner's clock, against observation stamps (0: no age check)."""
        observed = set(observed)
        accepted, refused = [], []
        for q in questions:
            fitted = fit_question(self.engine.tokenizer, q.text, self.engine.config.max_question_tokens)
            if why := self._refusal(q, fitted, observed, now_ros_ns):
                refused.append(q._replace(refusal=why))
            else:
                self._same_id(q, accepted)
                accepted.append(self._accepted(q, fitted))
        return accepted, refused

    def _same_id(self, q: WaitingQuestion, accepted: list[Question]) -> None:
        """Warn when ``q`` shares its robot's and client id with a question whose answer is still
        to come (waiting, decoding, or ``accepted`` in this frame): the two answers' TextTokens
        carry one client_id, told apart only by their request_id. Answered all the same."""
        requests = self.engine.requests
        earlier = [f"request {r.id}" for r in (*requests.active.values(), *requests.queue)
                   if r.client_id == q.client_id and r.robot == q.robot and not r.done]
        earlier += ["one taken in this frame" for a in accepted if a.client_id == q.client_id and a.robot == q.robot]
        if earlier:
            self.robot(q.robot).count["questions_same_client_id"] += 1
            self.warn("same_client_id", f"question from {q.client_id!r}{_from(q.robot)} while the answer to an "
                      f"earlier one with that id is still to come ({earlier[0]}): both answers' TextTokens carry "
                      "that client_id, told apart only by request_id; give each question an id of its own")

    def _refusal(self, q: WaitingQuestion, fitted: FittedQuestion, observed: set[str], now_ros_ns: int) -> str:
        """Why ``q`` is refused, counted and logged ("" when it is not): its ``refusal``, which an
        Ask goal's result carries."""
        engine, robot = self.engine, self.robot(q.robot)
        max_decode = engine.config.max_decode
        if not q.client_id:
            count, key, who, why = "no_client_id", "no_client_id", "question", NO_CLIENT_ID
        elif not fitted.text:
            count, key, who, why = "empty", "empty", f"question from {q.client_id!r}", "no text"
        elif tokens_beyond(q.max_tokens, max_decode):
            count, key, who, why = "max_tokens", "max_tokens", f"question from {q.client_id!r}", (
                f"it asks for {q.max_tokens} tokens, more than max_decode={max_decode}")
        elif q.robot not in observed and q.robot not in engine.last_observations:
            invalid = robot.counters["observations_invalid"]
            count, key, who = "no_observation", "no_observation", "question(s)"
            why = (f"no observation{_from(q.robot)} was usable yet ({invalid} refused: the log says why)"
                   if invalid else f"no observation has arrived yet{_from(q.robot)}")
        elif q.robot not in observed and (age_s := self._stale_s(q.robot, now_ros_ns)) is not None:
            count, key, who = "stale", f"stale_answer{q.robot}", "question(s)"
            why = (f"the newest observation{_from(q.robot)} is {age_s:.1f} s old (max_observation_age "
                   f"{self.max_observation_age:g} s): is its camera running?")
        else:
            return ""
        robot.count[f"questions_rejected_{count}"] += 1
        self.warn(key, f"{who} refused: {why}")
        return why

    def _stale_s(self, robot: str, now_ros_ns: int) -> float | None:
        """The age of the observation the engine would answer ``robot`` from, when beyond
        ``max_observation_age`` (None: fresh enough, unstamped, or no check)."""
        max_age, stamp = self.max_observation_age, self.engine.last_observations[robot].stamp
        age_s = now_ros_ns / NS_PER_S - stamp
        return age_s if max_age > 0 and stamp > 0 and now_ros_ns > 0 and age_s > max_age else None

    def _accepted(self, q: WaitingQuestion, fitted: FittedQuestion) -> Question:
        """``q`` as the engine takes it: cleaned, cut to ``max_question_tokens`` (counted, logged)."""
        limit = self.engine.config.max_question_tokens
        if fitted.truncated:
            self.robot(q.robot).count["questions_truncated"] += 1
            self.warn("question_cut", f"question from {q.client_id!r} ({len(q.text)} characters, "
                      f"{fitted.tokens}+ tokens) cut to {limit} tokens")
        return Question(text=fitted.text, client_id=q.client_id, max_tokens=q.max_tokens, robot=q.robot,
                        cut=fitted.truncated)


def _from(robot: str) -> str:
    """' from robot X' for a log line (nothing for the one robot of a node without robots)."""
    return f" from robot {robot}" if robot else ""


__all__ = ["QuestionIntake"]
