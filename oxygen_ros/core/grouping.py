"""When the camera node publishes the next Observation group (no ROS in here).

The camera node keeps the newest frame of every camera; :class:`FrameGrouping`
decides, each time a frame or a state arrives, whether those frames form the
next group now:

* every camera must have delivered a frame newer than the last published group
  (a frame with the stamp of the one already grouped does not count: a re-sent
  frame; stamps may go backwards, a looping bag, and the newest frame is used);
* a camera whose newest frame is more than half its period older than the group's
  newest frame (and less than one and a half: a later frame of it is overdue, lost
  or the camera stopped) is waited for, once per group and one of its periods at
  most: its next frame is closer in time to the others (``WAIT``). Synchronised
  cameras whose faster camera lost one frame would otherwise pair each of its
  frames with the others' previous ones from then on, a whole period apart;
  free-running cameras end up paired within half a period. A camera's period is
  the shortest step between its recent stamps (lost frames make longer steps);
  until it has one, it is never waited for. When its next frame does not come
  within the period (it was lost, or a lockstep bag player holds it until this
  group's chunk comes back), the group goes out with the frame there is:
  ``retry_ns`` says when to decide again;
* a group whose oldest frame is older than ``max_age`` is dropped (``STALE``):
  the stale cameras must deliver a newer frame;
* with a state required (the node's ``state_topic``), a group is not published
  while there is no valid state (``NO_STATE``; a rejected state is never
  replaced by an older one). The frames stay waiting, and the next event
  decides again: a valid state publishes them at once (when they are still
  fresher than ``max_age``), so a group is never a camera period late because
  its image came just before its state;
* the state is waited for as a camera is: when its stamp is more than half its
  period older than the group's newest frame (and less than one and a half),
  its next message is closer in time to the frames (``WAIT``). A driver that
  publishes each image and then the state taken with it (a synthetic camera, a
  teleoperation rig, a bag of either) would otherwise pair every image with the
  state of the period before. A state published faster than the cameras (a
  ``ros2_control`` broadcaster) makes a group wait at most half its own period.
  A group waits only for a state due within half a frame period (the cameras'
  shortest) of its newest frame: a state slower than the cameras (a 10 Hz
  driver beside 30 Hz cameras) would otherwise hold many groups back for tens
  of milliseconds, for a state hardly closer in time. Until two states have
  come, the cameras' shortest period stands for the state's (a state published
  with each image). No state is waited for with ``state_wait`` off. A group waits one state period at most: ``retry_ns``
  says when to decide again if nothing comes (the state's driver stopped, a bag
  ended), and the group then goes out with the state held.

Times are integer nanoseconds on one clock (the node's).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

PUBLISH, WAIT, STALE, NO_STATE = "publish", "wait", "stale", "no_state"
#: Stamp steps per camera from which its period is taken (the shortest of them).
PERIOD_STEPS = 8


#: Steps from which :func:`typical_period_ns` takes a median (with fewer, the shortest)
MEDIAN_STEPS = 3


def typical_period_ns(steps) -> int | None:
    """A camera's period from its recent stamp ``steps`` (each > 0): the median of those of one
    period (under 1.75 times the shortest; the longer ones have frames missing in them), from
    :data:`MEDIAN_STEPS` of them on; the shortest before (None: none). The shortest alone is
    short of the period when the publisher's stamps jitter: a publisher that stamps with its
    clock when it gets to it steps shorter than its period now and then."""
    if not steps:
        return None
    shortest = min(steps)
    if len(steps) < MEDIAN_STEPS:
        return shortest
    single = sorted(s for s in steps if s < 1.75 * shortest)
    return single[len(single) // 2]


@dataclass(frozen=True)
class Decision:
    """What to do now: ``kind`` is one of PUBLISH, WAIT, STALE (``stale``: the cameras
    whose frames are too old, now no longer counted as new) and NO_STATE; ``retry_ns``:
    a WAIT for a camera's next frame or for the state, to be decided again at that time
    (:meth:`FrameGrouping.again`) if nothing arrives before."""

    kind: str
    stale: tuple[int, ...] = ()
    retry_ns: int | None = None


class FrameGrouping:
    """See the module doc. ``cameras``: how many; ``needs_state``: no group without a valid state;
    ``state_wait``: a group waits for the state due next when it is closer in time."""

    def __init__(self, cameras: int, needs_state: bool, state_wait: bool = True):
        if cameras < 1:
            raise ValueError(f"need at least one camera, got {cameras}")
        self.needs_state = needs_state
        self.state_wait = state_wait
        self.stamps: list[int | None] = [None] * cameras  # the newest frame's stamp, per camera
        self._fresh = [False] * cameras
        self._grouped = [-1] * cameras  # stamps of the frames in the last published group
        self._steps = [deque(maxlen=PERIOD_STEPS) for _ in range(cameras)]  # recent stamp steps, per camera
        # camera -> (its stamp, the time) when this group began waiting for its next frame
        self._waited: dict[int, tuple[int, int]] = {}
        self.state_stamp: int | None = None  # the newest state's stamp
        self._state_steps: deque[int] = deque(maxlen=PERIOD_STEPS)
        self._state_since: int | None = None  # when this group began waiting for a newer state

    def frame_arrived(self, index: int, stamp_ns: int, now_ns: int, max_age_s: float, has_state: bool) -> Decision:
        """Camera ``index`` delivered a good frame stamped ``stamp_ns``; ``has_state``: a valid
        state is held now."""
        previous = self.stamps[index]
        if previous is not None and stamp_ns > previous:
            self._steps[index].append(stamp_ns - previous)
        self.stamps[index] = stamp_ns
        if stamp_ns != self._grouped[index]:
            self._fresh[index] = True
        return self._decide(now_ns, max_age_s, has_state)

    def state_arrived(self, now_ns: int, max_age_s: float, stamp_ns: int) -> Decision:
        """A valid state stamped ``stamp_ns`` arrived: frames held back for want of one, or
        waiting for a newer one, go out now (a camera publishes its state right after its
        image, so the frame that found no valid state, the first after a drop-out or after a
        rejected state, need not wait a camera period for the next one)."""
        previous = self.state_stamp
        if previous is not None and stamp_ns > previous:
            self._state_steps.append(stamp_ns - previous)
        self.state_stamp = stamp_ns
        return self._decide(now_ns, max_age_s, True)

    def again(self, now_ns: int, max_age_s: float, has_state: bool) -> Decision:
        """Decide again, nothing new from the cameras (a group the node held, waiting for
        its instruction, can go out now; a group that waited for a state, at its ``retry_ns``)."""
        return self._decide(now_ns, max_age_s, has_state)

    def _decide(self, now_ns: int, max_age_s: float, has_state: bool) -> Decision:
        if not all(self._fresh):
            return Decision(WAIT)
        max_age_ns = round(max_age_s * 1e9)
        stale = tuple(i for i, s in enumerate(self.stamps) if now_ns - s > max_age_ns)
        if stale:
            for i in stale:
                self._fresh[i] = False
            self._state_since = None
            return Decision(STALE, stale)
        retry_ns = self._laggards_retry(now_ns)
        if retry_ns is not None:
            return Decision(WAIT, retry_ns=retry_ns)
        if self.needs_state and not has_state:
            return Decision(NO_STATE)
        if self.needs_state and self.state_wait:
            retry_ns = self._state_retry(now_ns)
            if retry_ns is not None:
                return Decision(WAIT, retry_ns=retry_ns)
        return Decision(PUBLISH)

    def period_ns(self, index: int) -> int | None:
        """Camera ``index``'s period as its stamps show it (None: not two frames yet)."""
        steps = self._steps[index]
        return min(steps) if steps else None

    def typical_period_ns(self, index: int) -> int | None:
        """Camera ``index``'s period robust to jitter (see :func:`typical_period_ns`), for counting
        the frames it lost; the grouping waits by :meth:`period_ns`."""
        return typical_period_ns(self._steps[index])

    def _frame_period_ns(self) -> int | None:
        """The cameras' shortest period (None: no camera has one yet)."""
        periods = [p for p in map(self.period_ns, range(len(self.stamps))) if p is not None]
        return min(periods) if periods else None

    def _state_period_ns(self) -> int | None:
        """The state's period as its stamps show it; until two states came, the cameras' shortest."""
        return min(self._state_steps) if self._state_steps else self._frame_period_ns()

    def _state_retry(self, now_ns: int) -> int | None:
        """When to decide again, if the next state is expected closer to the group's newest frame
        than the state held and the group has waited less than a state period for it (see the
        module doc); None: the group need not wait for the state."""
        period = self._state_period_ns()
        if self.state_stamp is None or period is None:
            return None
        lag = max(self.stamps) - self.state_stamp
        if not period < 2 * lag < 3 * period:
            return None
        frame_period = self._frame_period_ns()
        if frame_period is not None and 2 * (period - lag) > frame_period:
            return None  # the next state is not due within half a frame period
        if self._state_since is None:
            self._state_since = now_ns
        return self._state_since + period if 0 <= now_ns - self._state_since < period else None

    def _laggards_retry(self, now_ns: int) -> int | None:
        """When to decide again, if a camera's next frame is expected closer to the group's newest
        frame than its newest one (more than half a period older than it, less than one and a
        half) and has not come yet, nor one period of that camera after the group began waiting
        for it (once per group: a newer frame ends the camera's wait); None: no camera to wait for."""
        newest = max(self.stamps)
        retry = None
        for i, stamp in enumerate(self.stamps):
            period = self.period_ns(i)
            if period is None or not period < 2 * (newest - stamp) < 3 * period:
                continue  # close enough, or its next frame is overdue (lost, or the camera stopped)
            waited_stamp, since = self._waited.setdefault(i, (stamp, now_ns))
            if waited_stamp == stamp and 0 <= now_ns - since < period:
                retry = since + period if retry is None else min(retry, since + period)
        return retry

    def published(self) -> None:
        """The group of the newest frames went out: each camera needs a newer frame."""
        self._fresh = [False] * len(self._fresh)
        self._grouped = [int(s) for s in self.stamps]
        self._waited.clear()
        self._state_since = None

    def spread_ns(self) -> int:
        """How far apart the newest frames' stamps are (the group's, when it is published)."""
        return max(self.stamps) - min(self.stamps)


__all__ = ["NO_STATE", "PUBLISH", "STALE", "WAIT", "Decision", "FrameGrouping"]
