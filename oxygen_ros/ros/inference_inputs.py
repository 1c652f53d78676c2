"""The inference node's inputs: observations, questions, Ask goals and cancels, as they arrive.

Each is taken only while the inputs are open (``_inputs_open``, under the node's lock):
from the end of a configure to the start of a cleanup or shutdown. A callback on another
executor thread (``oxygen-agent --executor multi``, a user's ``MultiThreadedExecutor``)
then never feeds a loop that is going, or one that is not there yet: an observation is
dropped, a question gets its ``rejected`` end, an Ask goal is aborted, and a cancel is
left to the cleanup, which ends every request itself.
"""

from __future__ import annotations

import time
from typing import Optional

from oxygen_ros.msg import Observation as ObservationMsg
from oxygen_ros.msg import Question as QuestionMsg

from ..core.frame_loop import Arrival
from . import conversions
from .text_output import end_events


class InferenceInputs:
    """The inputs half of :class:`~.inference_node.InferenceNode` (a mixin: it reads the node's
    lock, loop, worker and text output)."""

    _inputs_open = False

    def _now_ros(self) -> int:
        return self.get_clock().now().nanoseconds

    def _close_inputs(self) -> None:
        """No observation, question, goal or cancel is taken from now on (cleanup, shutdown)."""
        with self._cond:
            self._inputs_open = False

    def _on_observation(self, robot: str, msg: ObservationMsg) -> None:
        received_ros, received = self._now_ros(), time.monotonic_ns()
        worker = self.worker
        if not self._inputs_open or worker is None:
            return
        observation = worker.converted(msg, int(msg.seq), robot)
        if observation is None:
            return
        arrival = Arrival(observation, int(msg.seq), conversions.stamp_to_ns(msg.header.stamp), received_ros,
                          received, robot)
        with self._cond:
            if self._inputs_open:
                self.loop.observation_arrived(arrival)
                self._cond.notify_all()

    def _on_question(self, robot: str, msg: QuestionMsg) -> None:
        if not self._on_ask(robot, msg.client_id, msg.text, None):  # closing: say so while it can
            try:
                self.text.publish(end_events([msg.client_id], "rejected", robot,
                                             "the node is closing (cleanup or shutdown)"), self._now_ros())
            except Exception:  # noqa: BLE001  the cleanup took the publisher already
                pass

    def _on_ask(self, robot: str, client_id: str, text: str, max_tokens: Optional[int]) -> bool:
        """A question (a message, or an Ask goal); False when the node takes none now (closing)."""
        with self._cond:
            if not self._inputs_open:
                return False
            self.loop.question_arrived(client_id, text, max_tokens, robot)
            self._cond.notify_all()
            waiting = None if self.active else self.loop.questions_waiting()
        if waiting is not None:  # paused by a lifecycle manager: the client would hear nothing until activate
            self.get_logger().info(f"question from '{client_id}' kept: the node is inactive (lifecycle) and answers "
                                   f"it after its activate transition ({waiting} questions waiting)",
                                   throttle_duration_sec=5.0)
        return True

    def _cancel_ask(self, robot: str, client_id: str) -> None:
        """A cancelled question ends at once: still waiting, here; decoding, in the engine, here
        too when no frame runs (the worker idle, or stopped while the node is inactive: the
        goal would otherwise stay canceling until activate), else at the worker's next job."""
        with self._cond:
            if not self._inputs_open:  # closing: the cleanup or shutdown ends every request itself
                return
            if self.loop.cancel(client_id, robot):
                events = end_events([client_id], "cancelled", robot)
            else:
                idle = self.worker is not None and not self.worker.busy
                events = self.loop.end_requests(self.loop.take_cancels()) if idle else []
            self._cond.notify_all()
        if events:
            self.text.publish(events, self._now_ros())
