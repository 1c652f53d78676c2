"""The inference node's text output: TextToken messages as frames return them."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable, Sequence

from rclpy.duration import Duration

from oxygen_ros.msg import TextToken

from ..core.requests import TokenEvent
from ..core.stats import WindowRate
from . import conversions
from .qos import reliable


def end_events(clients: Iterable[str], reason: str, robot: str = "", detail: str = "") -> list[TokenEvent]:
    """The final token of ``robot``'s requests that never got an id (refused, or cancelled while
    waiting); ``detail``: why, in words (an Ask goal's result carries it)."""
    return [TokenEvent(0, client, 0, 0, -1, "", True, reason, robot, detail) for client in clients]


#: The robot's newest frames whose observations a TextToken can name (a request reads the
#: observation of its frame_id: started there, or the newest when its question came): far
#: more than a request waits before its first token. From that token on, the request keeps
#: its observation until it ends, however long it decodes.
OBSERVATIONS_KEPT = 1024


class TextOutput:
    """Publishes TextTokens (reliable, a deep queue), each naming the observation its request
    reads (:meth:`observed`), and measures the token rate."""

    def __init__(self, node, topic: str, counters: collections.Counter):
        self._pub = node.create_publisher(TextToken, topic, reliable(1000))
        self._counters = counters
        self.rate = WindowRate(5.0)  # real tokens (not ends) per second
        self.listener: Callable[[Sequence[TokenEvent]], None] | None = None  # sees every published event
        self._observations: collections.OrderedDict[int, tuple[int, int]] = collections.OrderedDict()
        self._read: dict[int, tuple[int, int]] = {}  # request id -> (seq, stamp ns) it reads, until it ends

    def observed(self, frame_id: int, seq: int, stamp_ns: int) -> None:
        """The engine's frame ``frame_id`` took the robot's observation ``seq``, stamped ``stamp_ns``."""
        self._observations[frame_id] = (seq, stamp_ns)
        if len(self._observations) > OBSERVATIONS_KEPT:
            self._observations.popitem(last=False)

    def publish(self, events: Sequence[TokenEvent], stamp_ns: int) -> None:
        if not events:
            return
        stamp = conversions.ns_to_time_msg(stamp_ns)
        for event in events:
            seq, observed_ns = self._observation_of(event)
            self._pub.publish(conversions.text_token_msg(stamp, event, observation_seq=seq,
                                                         observation_stamp_ns=observed_ns))
        self.rate.add(time.monotonic(), sum(1 for e in events if e.token_id >= 0))
        self._counters["text_tokens_published"] += len(events)
        if self.listener is not None:
            self.listener(events)

    def _observation_of(self, event: TokenEvent) -> tuple[int, int]:
        """(seq, stamp ns) of the observation ``event``'s request reads; (0, 0) for an event
        without a request (a question refused before it became one)."""
        if not event.request_id:
            return 0, 0
        read = self._read.get(event.request_id)
        if read is None:
            read = self._read[event.request_id] = self._observations.get(event.frame_id, (0, 0))
            if len(self._read) > OBSERVATIONS_KEPT:  # (far more than run at once: an end never published)
                del self._read[next(iter(self._read))]
        if event.done:
            del self._read[event.request_id]
        return read

    def flush(self, seconds: float = 1.0) -> None:
        """Wait (at most ``seconds``) until reliable subscribers have what was published."""
        try:
            self._pub.wait_for_all_acked(Duration(seconds=seconds))
        except Exception:  # noqa: BLE001 - best effort (the context may be going down)
            pass
