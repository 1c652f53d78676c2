"""One robot's ROS interfaces on the inference node, and the text router over all robots.

With ``robots`` empty the node serves one robot (named ``""``) on the
configured topics. With ``robots: [left, right]`` every robot ``r`` gets the
configured topics under ``/r`` (:func:`.robots.robot_topic`): it subscribes
``/r/oxygen/observation`` and ``/r/oxygen/question``, publishes
``/r/oxygen/actions``, ``/r/oxygen/text`` and ``/r/oxygen/joint_trajectory``
and serves the Ask action on ``/r/oxygen/ask``. Each :class:`RobotIO` has its
own action output (chunk clock, hold and underrun state), text output (token
rate), Ask server and status reporter; :class:`TextRouter` sends every token
event to the text output of its request's robot.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from functools import partial
from typing import Optional

from oxygen_ros.msg import Observation as ObservationMsg
from oxygen_ros.msg import Question as QuestionMsg

from ..core.requests import TokenEvent
from ..core.robot_inputs import RobotInputs
from ..core.stats import WindowRate
from .action_output import ActionOutput
from .ask_server import AskServer
from .inference_status import StatusReporter
from .qos import OBSERVATION_INPUT_QOS, reliable
from .robots import robot_topic
from .text_output import TextOutput

#: The node's topic parameters a robot gets under its own namespace.
ROBOT_TOPICS = ("observation_topic", "question_topic", "actions_topic", "text_topic", "trajectory_topic",
                "ask_action")


class RobotIO:
    """One robot's publishers, subscriptions and Ask server on ``node`` (see the module doc).
    The callbacks get the robot's name first: ``on_observation(robot, msg)``,
    ``on_question(robot, msg)``, ``on_ask(robot, client, text, max_tokens)``, ``on_cancel(robot, client)``.
    ``make_output(counters, records, actions_topic=, trajectory_topic=)`` makes its action output
    (default: an :class:`~.action_output.ActionOutput` on ``node``; with the control process, a
    :class:`~.control_link.RemoteOutput`). ``ask_server(action)``: the node's Ask server on that
    action (it outlives this object: :mod:`.ask_server`), opened here."""

    def __init__(self, node, inputs: RobotInputs, params: dict, *,
                 on_observation: Callable, on_question: Callable, on_ask: Callable, on_cancel: Callable,
                 inputs_group, ask_server: Callable[[str], AskServer], make_output: Optional[Callable] = None):
        self.name, self.inputs = inputs.name, inputs
        self.counters = inputs.count  # its counts, the node's totals beside them
        topic = {key: robot_topic(self.name, params[key]) for key in ROBOT_TOPICS}
        make_output = make_output or partial(ActionOutput, node, params)
        self.output = make_output(self.counters, inputs.records, actions_topic=topic["actions_topic"],
                                  trajectory_topic=topic["trajectory_topic"])
        self.text = TextOutput(node, topic["text_topic"], self.counters)
        self.ask = ask_server(topic["ask_action"])
        self.ask.open(partial(on_ask, self.name), partial(on_cancel, self.name))
        self.text.listener = self.ask.on_events  # the goals' feedback and results
        observations = node.create_subscription(ObservationMsg, topic["observation_topic"],
                                                partial(on_observation, self.name), OBSERVATION_INPUT_QOS,
                                                callback_group=inputs_group)
        self.observation_topic = observations.topic_name
        node.create_subscription(QuestionMsg, topic["question_topic"], partial(on_question, self.name),
                                 reliable(100), callback_group=inputs_group)
        self.status = StatusReporter(self.observation_topic)
        self.chunk_rate = WindowRate(5.0)  # chunks pushed per second
        self.frame_share = collections.deque(maxlen=200)  # 1 / observations of each of its frames


class TextRouter:
    """Token events to the text output of their robot (one publish per robot), and the
    node's token rate over all of them."""

    def __init__(self, robots: Sequence[RobotIO]):
        self._by_name = {io.name: io.text for io in robots}
        self._first = robots[0].text

    def publish(self, events: Sequence[TokenEvent], stamp_ns: int) -> None:
        by_robot: dict[str, list[TokenEvent]] = {}
        for event in events:
            by_robot.setdefault(event.robot, []).append(event)
        for robot, batch in by_robot.items():
            self._by_name.get(robot, self._first).publish(batch, stamp_ns)

    def observed(self, robot: str, frame_id: int, seq: int, stamp_ns: int) -> None:
        """``robot``'s observation ``seq`` (stamped ``stamp_ns``) went into the frame ``frame_id``:
        its robot's TextTokens of requests reading it name it."""
        self._by_name.get(robot, self._first).observed(frame_id, seq, stamp_ns)

    def rate(self, now: float) -> float:
        """Tokens per second over every robot."""
        return sum(text.rate.rate(now) for text in self._by_name.values())

    def flush(self, seconds: float = 1.0) -> None:
        for text in self._by_name.values():
            text.flush(seconds / len(self._by_name))
