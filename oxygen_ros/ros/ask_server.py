"""Questions as a ROS 2 action: ``oxygen_ros/action/Ask`` on ``ask_action`` (default ``/oxygen/ask``).

Each accepted goal becomes a language request like a ``/oxygen/question``
message, with the client id ``ask/<goal uuid>``: answered from the newest
observation, decoded in the same continuous batch as every other request, its
tokens also streamed on ``/oxygen/text``. While it decodes, every token is sent
as feedback (index, id, piece, the text so far). The result carries the whole
text, the finish reason, the token count and, when the node refused the goal or
ended it itself, why (``reason``); the goal ends ``succeeded`` for
``eos`` and ``length``, ``aborted`` for ``rejected`` (no text, no observation
yet or only a stale one, the queue full, more tokens asked for than ``max_decode``) and ``canceled``
when the client cancelled it, which ends the request at once and frees its KV slot.

The server lives as long as the node, across lifecycle transitions: a cleanup
ends every goal (``aborted``, finish reason ``cancelled``: the client did not ask
for it) and its result still reaches the client; while the node is not
configured, goals are refused (rejected at once, with a log line saying why).

The goal's execute callback is a coroutine awaiting the request's end; the
tokens reach :meth:`AskServer.on_events` from the frame worker's thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.task import Future

from oxygen_ros.action import Ask

from ..core.requests import TokenEvent
from .qos import ASK_QOS

#: Client ids of action goals start with this (topic questions may use any other id).
CLIENT_PREFIX = "ask/"


@dataclass
class _Goal:
    handle: object
    done: Future = field(default_factory=Future)
    pieces: list[str] = field(default_factory=list)


class AskServer:
    """The ``Ask`` action server of an inference node on action ``name``: closed (refusing
    goals) until :meth:`open`. ``submit(client_id, text, max_tokens)`` starts a request
    (max_tokens None: the node's max_decode); ``cancel(client_id)`` ends it."""

    def __init__(self, node, name: str, callback_group=None):
        self._submit: Callable[[str, str, int | None], None] | None = None
        self._cancel: Callable[[str], None] | None = None
        self._goals: dict[str, _Goal] = {}
        self._lock = threading.Lock()
        self._log = node.get_logger()
        self._server = ActionServer(node, Ask, name, execute_callback=self._execute, callback_group=callback_group,
                                    goal_callback=self._on_goal, cancel_callback=self._on_cancel,
                                    goal_service_qos_profile=ASK_QOS, result_service_qos_profile=ASK_QOS,
                                    cancel_service_qos_profile=ASK_QOS, feedback_pub_qos_profile=ASK_QOS)

    def open(self, submit: Callable[[str, str, int | None], bool], cancel: Callable[[str], None]) -> None:
        """Take goals from now on: each is submitted with ``submit`` (False: the node took it
        not, closing), cancelled with ``cancel``."""
        self._submit, self._cancel = submit, cancel

    def close(self) -> None:
        """Refuse goals from now on (the node's cleanup: the goals running end with its
        requests, through :meth:`on_events`)."""
        self._submit = self._cancel = None

    def _on_goal(self, goal) -> GoalResponse:
        if self._submit is None:
            self._log.warning("Ask goal refused: the inference node is not configured", throttle_duration_sec=5.0)
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    @staticmethod
    def client_id(handle) -> str:
        return CLIENT_PREFIX + bytes(handle.goal_id.uuid).hex()

    async def _execute(self, handle) -> Ask.Result:
        client, goal, submit = self.client_id(handle), _Goal(handle), self._submit
        if submit is None:  # accepted just before a cleanup
            handle.abort()
            return Ask.Result(finish_reason="rejected", reason="the inference node is not configured")
        with self._lock:
            self._goals[client] = goal
        if not submit(client, handle.request.question, handle.request.max_tokens or None):
            with self._lock:  # the node closed its inputs (a cleanup began): no end would ever come
                self._goals.pop(client, None)
            handle.abort()
            return Ask.Result(finish_reason="rejected", reason="the inference node is closing (a cleanup began)")
        reason, tokens, detail = await goal.done
        if reason == "cancelled" and handle.is_cancel_requested:
            handle.canceled()
        elif reason in ("rejected", "cancelled"):  # cancelled by the node (its cleanup), not by the client
            handle.abort()
        else:
            handle.succeed()
        return Ask.Result(text="".join(goal.pieces), finish_reason=reason, tokens=tokens, reason=detail)

    def _on_cancel(self, handle) -> CancelResponse:
        cancel = self._cancel
        if cancel is not None:
            cancel(self.client_id(handle))
        return CancelResponse.ACCEPT

    def on_events(self, events: Sequence[TokenEvent]) -> None:
        """Feedback for the goals' tokens; a goal's last event ends it."""
        for event in events:
            if not event.client_id.startswith(CLIENT_PREFIX):
                continue
            with self._lock:
                goal = self._goals.get(event.client_id)
                if goal is not None and event.done:
                    del self._goals[event.client_id]
            if goal is None:
                continue
            if event.token_id >= 0:
                goal.pieces.append(event.piece)
                goal.handle.publish_feedback(Ask.Feedback(index=event.index, token_id=event.token_id,
                                                          piece=event.piece, text="".join(goal.pieces)))
            if event.done:
                goal.done.set_result((event.finish_reason, len(goal.pieces), event.detail))

    def destroy(self) -> None:
        self._server.destroy()
