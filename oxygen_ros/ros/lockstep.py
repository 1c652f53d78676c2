"""The bag player's lockstep gates: an image is held until the policy answered the previous observation.

A :class:`LockstepGate` follows one ``oxygen_ros/ActionChunk`` topic: it lets
an image topic's next image out once an ActionChunk for an observation newer
than the one at the last release arrived (or ``timeout_s`` passed), so that
the model sees every recorded frame, one observation at a time. Each camera
of a group sends one image per release (the images of one observation).
An image waits only once every camera of the gate (:attr:`LockstepGate.image_topics`)
has sent one since the release: cameras at different rates (30 and 10 Hz)
would otherwise deadlock until the timeout, the faster one's next image held
for an observation that the camera node forms only with the slower one's
frame, which comes later in the bag. Until then the faster camera's images go
on (the camera node keeps the newest of each camera).

Nor does an image wait before the first message of each of the gate's state
topics (its robot's ``sensor_msgs/JointState`` topics in the bag) has gone
out: a camera node with a ``state_topic`` groups no image without a state, so
no chunk would answer it, and the gate would wait the whole timeout. A bag
recorded from a running robot often begins that way (the recorder found the
image topic before the state's). The camera node keeps the newest of those
images, and the first state completes a group with it.

One gate serves one robot. With ``lockstep_robots: [left, right]`` the bag
player has a gate per robot on ``/<robot>`` + ``action_topic``
(``/left/oxygen/actions``), and an image topic under ``/<robot>/``
(``/left/camera/image_raw``) goes through that robot's gate; any other image
topic through the gate on ``action_topic`` itself (:func:`gate_key`).
"""

from __future__ import annotations

from .robots import robot_topic


class LockstepGate:
    """The lockstep state of one robot: the newest observation answered on ``action_topic``."""

    def __init__(self, action_topic: str, image_topics: tuple[str, ...] = (), state_topics: tuple[str, ...] = ()):
        self.action_topic = action_topic
        #: the image topics through this gate (a group is one image of each; empty: any one is a group)
        self.image_topics = frozenset(image_topics)
        self.state_topics = frozenset(state_topics)  # its robot's JointState topics
        self._states_sent: set[str] = set()
        self.action_seq = -1  # highest ActionChunk.observation_seq seen
        self.timeouts = 0
        self._gate_seq = -1
        self._images_since_release: set[str] = set()
        self.hold_since: float | None = None  # when the image now held began to wait

    def on_actions(self, msg) -> None:
        self.action_seq = max(self.action_seq, int(msg.observation_seq))

    def open(self, topic: str, now: float, timeout_s: float) -> tuple[bool, str | None]:
        """May ``topic``'s image go out now? Also a warning to log when the wait timed out."""
        if (topic not in self._images_since_release or not self.image_topics <= self._images_since_release
                or not self.state_topics <= self._states_sent):
            return True, None  # its first image since the release, the group is not complete yet, or no state was
        warning = None
        if self.action_seq > self._gate_seq:
            released = True
        elif self.hold_since is not None and now - self.hold_since >= timeout_s:
            self.timeouts += 1
            since = "yet" if self._gate_seq < 0 else f"newer than observation {self._gate_seq}"
            warning = (f"lockstep: no ActionChunk on {self.action_topic} {since} "
                       f"within {timeout_s} s; playing on (an observation gets none when the camera node dropped "
                       "its group as stale, or when its chunk had no row left: stamps that lag their bag times by "
                       "nearly a chunk's span; chunk_origin: frame_end publishes every chunk)")
            released = True
        else:
            released = False
        if not released:
            if self.hold_since is None:
                self.hold_since = now
            return False, None
        self._gate_seq = self.action_seq
        self._images_since_release.clear()
        return True, warning

    def sent(self, topic: str) -> None:
        """``topic``'s image went out: its next one waits for the next release."""
        self._images_since_release.add(topic)

    def state_sent(self, topic: str) -> None:
        """A message of ``topic``, one of the state topics, went out."""
        self._states_sent.add(topic)


def gate_key(topic: str, robots: list[str] | tuple[str, ...]) -> str:
    """The robot whose gate ``topic``'s images go through ("" for the gate on ``action_topic``)."""
    for robot in robots:
        if topic.startswith(f"/{robot}/"):
            return robot
    return ""


def gate_topics(action_topic: str, robots: list[str] | tuple[str, ...]) -> dict[str, str]:
    """The ActionChunk topic of every gate: "" -> ``action_topic``, each robot -> its own."""
    return {"": action_topic, **{robot: robot_topic(robot, action_topic) for robot in robots}}


__all__ = ["LockstepGate", "gate_key", "gate_topics"]
