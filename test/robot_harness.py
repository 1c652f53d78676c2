"""Helpers for the tests of an inference node serving several robots (``robots`` parameter).

* :func:`robots_node` - an InferenceNode serving ``robots``, its topics under a unique prefix.
* :class:`RobotClient` - one robot's side: publishes its observations and questions on
  ``/<robot><prefix>/...`` and records its ActionChunks and TextTokens.
"""

from __future__ import annotations

from message_builders import observation_msg
from ros_harness import params, reliable, until

TOPICS = ("observation_topic", "question_topic", "actions_topic", "text_topic", "trajectory_topic", "ask_action")


def robots_node(ros, prefix: str, robots, **overrides):
    """An InferenceNode added to ``ros`` serving ``robots``, each on ``/<robot><prefix>/<name>``
    (the embedded default model unless overridden)."""
    from oxygen_ros.ros.inference_node import InferenceNode

    topics = {name: f"{prefix}/{name.replace('_topic', '').replace('_action', '')}" for name in TOPICS}
    values = {"robots": list(robots), "preset": "tiny", "model_path": "", "chunk_origin": "frame_end",
              **topics, **overrides}
    return ros.add(InferenceNode(context=ros.context, parameter_overrides=params(**values)))


class RobotClient:
    """One robot's side of a :func:`robots_node` (its own topics), on the test's ``node``."""

    def __init__(self, node, prefix: str, robot: str):
        from oxygen_ros.msg import ActionChunk, Observation, Question, TextToken

        base = f"/{robot}{prefix}"
        self.robot, self.node, self.seq = robot, node, 0
        self.chunks, self.text = [], []
        self.actions = node.create_subscription(ActionChunk, f"{base}/actions", self.chunks.append, reliable(1000))
        node.create_subscription(TextToken, f"{base}/text", self.text.append, reliable(5000))
        self.obs = node.create_publisher(Observation, f"{base}/observation", reliable(10))
        self.q = node.create_publisher(Question, f"{base}/question", reliable(1000))
        self.Question = Question

    def discovered(self, inference=None) -> bool:
        """It and the node found each other: the node's inputs, and its ActionChunk publisher
        (in the control process by default, a participant of its own); with ``inference`` (the
        node), also that publisher's side, so that no ActionChunk is lost to discovery."""
        return (self.obs.get_subscription_count() >= 1 and self.q.get_subscription_count() >= 1
                and self.actions.get_publisher_count() >= 1
                and (inference is None or inference.action_subscribers(self.robot) >= 1))

    def wait_discovered(self, inference=None) -> None:
        assert until(lambda: self.discovered(inference)), f"robot {self.robot}: inference node not discovered"

    def observe(self, msg=None, **kw) -> int:
        """Publish ``msg`` or the next observation (:func:`observation_msg`, stamped now); its seq."""
        seq = self.seq
        self.obs.publish(msg if msg is not None else
                         observation_msg(seq, self.node.get_clock().now().nanoseconds, **kw))
        self.seq += 1
        return seq

    def ask(self, client_id: str, text: str = "what do you see?") -> None:
        self.q.publish(self.Question(client_id=client_id, text=text))

    def chunks_of(self, seq: int) -> list:
        return [m for m in self.chunks if m.observation_seq == seq]
