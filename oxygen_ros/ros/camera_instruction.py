"""The camera node's task instruction: its subscriptions, its cleaning, and the first group's wait.

The instruction comes on ``instruction_topic`` (``std_msgs/String``). Two
subscriptions take it: a latched one gets a transient-local publisher's
instruction sent before the node started, and a volatile one matches the
volatile publishers (``ros2 topic pub``, a plain ``create_publisher``), which a
transient-local subscription refuses as incompatible. A latched instruction
so comes twice: the same text, logged once. The latched subscription's own
"incompatible QoS" warning about a volatile publisher is not logged: the
volatile one takes its messages (the publisher's side may still log it).

Control characters are removed (with a warning); an empty instruction asks for
``default_instruction`` (with a warning), and with that empty too it clears the
task (:meth:`CameraInstruction.task_cleared`: no group goes out until an
instruction comes; a robot's "stop" is not a task to carry on with). Until the first group has gone out, a
group is held while an instruction may still come
(:mod:`oxygen_ros.core.instruction_wait`): :meth:`CameraInstruction.hold` says
so and logs it, and ``on_held_arrived`` is called when the instruction comes to
a held group.
"""

from __future__ import annotations

from collections.abc import Callable

from rclpy.event_handler import SubscriptionEventCallbacks
from std_msgs.msg import String

from oxygen_ros.core.instruction_wait import HOLD, RAN_OUT, InstructionWait
from oxygen_ros.core.text import clean_text, clip
from oxygen_ros.ros.qos import LATCHED_QOS, reliable


class CameraInstruction:
    """The instruction of ``node``'s groups. ``default``: the node's ``default_instruction`` now;
    ``warn(key, text, info=False)``: the node's throttled log."""

    def __init__(self, node, topic: str, wait_s: float, default: Callable[[], str],
                 warn: Callable[..., None], on_held_arrived: Callable[[], None]):
        self._node = node
        self._default = default
        self._warn = warn
        self._on_held_arrived = on_held_arrived
        self.text: str | None = None  # the instruction received (None: none yet, or an empty one)
        self._emptied = False  # the last instruction received was empty
        self.wait = InstructionWait(wait_s)
        expected = SubscriptionEventCallbacks(incompatible_qos=lambda event: None)  # a volatile publisher
        self.subscriptions = [node.create_subscription(String, topic, self._on_message, LATCHED_QOS,
                                                       event_callbacks=expected),
                              node.create_subscription(String, topic, self._on_message, reliable(1))]
        self.topic: str = self.subscriptions[-1].topic_name  # as remapped

    def current(self) -> str:
        """What the next group carries: the instruction received, else ``default_instruction``."""
        return self.text if self.text is not None else self._default()

    def task_cleared(self) -> bool:
        """An empty instruction came, and ``default_instruction`` is empty: there is no task, and
        no group goes out (the model would act on an empty prompt) until an instruction comes."""
        return self._emptied and not self._default().strip()

    def _on_message(self, msg: String) -> None:
        text = clean_text(msg.data)
        if text != msg.data:
            self._warn("instruction_control", f"instruction had control characters, removed: "
                       f"{clip(msg.data)!r} -> {clip(text)!r}")
        was_cleared, self._emptied = self.task_cleared(), not text.strip()
        if self.task_cleared():
            if not was_cleared:  # (a latched instruction comes twice: said once)
                self._node.get_logger().warning(f"empty instruction on {self.topic}, and default_instruction is "
                                                "empty: the task is cleared, and no observation goes out (the robot "
                                                "gets no new action) until an instruction comes")
            text = None
        elif self._emptied:
            self._warn("instruction_empty", f"empty instruction on {self.topic}: using "
                       f"default_instruction {self._default()!r}")
            text = None
        elif text != self.text:
            self._node.get_logger().info(f"instruction ({len(text)} characters): {clip(text)!r}")
        self.text = text
        if self.wait.arrived():  # the group held for it goes out now, with it
            self._on_held_arrived()

    def hold(self, now_ns: int) -> bool:
        """Whether the group ready at ``now_ns`` is held for the instruction (logged; when the
        wait runs out, a warning: the group goes out with ``default_instruction``)."""
        verdict = self.wait.check(now_ns, lambda: self._node.count_publishers(self.topic))
        wait = f"instruction_wait_s {self.wait.wait_s:g}"
        if verdict == HOLD:
            self._warn("no_instruction", f"a publisher is on {self.topic} but no instruction has come yet: "
                       f"holding the first group ({wait})", info=True)
            return True
        if verdict == RAN_OUT:
            self._node.get_logger().warning(f"no instruction came on {self.topic} within {wait}, though a "
                                            f"publisher is there: publishing with default_instruction "
                                            f"{self._default()!r}")
        return False


__all__ = ["CameraInstruction"]
