"""When the camera node publishes the next Observation group (no ROS in here).

The camera node keeps the newest frame of every camera; :class:`FrameGrouping`
decides, each time a frame or a state arrives, whether those frames form the
next group now:

* every camera must have delivered a frame newer than the last published group
  (a frame with the stamp of the one already grouped does not count: a re-sent
  frame; stamps may go backwards, a looping bag, and the newest frame is used);
* a group whose oldest frame is older than ``max_age`` is dropped (``STALE``):
  the stale cameras must deliver a newer frame;
* with a state required (the node's ``state_topic``), a group is not published
  while there is no valid state (``NO_STATE``; a rejected state is never
  replaced by an older one). The frames stay waiting, and the next event
  decides again: a valid state publishes them at once (when they are still
  fresher than ``max_age``), so a group is never a camera period late because
  its image came just before its state.

Times are integer nanoseconds on one clock (the node's).
"""

from __future__ import annotations

from dataclasses import dataclass

PUBLISH, WAIT, STALE, NO_STATE = "publish", "wait", "stale", "no_state"


@dataclass(frozen=True)
class Decision:
    """What to do now: ``kind`` is one of PUBLISH, WAIT, STALE (``stale``: the cameras
    whose frames are too old, now no longer counted as new) and NO_STATE."""

    kind: str
    stale: tuple[int, ...] = ()


class FrameGrouping:
    """See the module doc. ``cameras``: how many; ``needs_state``: no group without a valid state."""

    def __init__(self, cameras: int, needs_state: bool):
        if cameras < 1:
            raise ValueError(f"need at least one camera, got {cameras}")
        self.needs_state = needs_state
        self.stamps: list[int | None] = [None] * cameras  # the newest frame's stamp, per camera
        self._fresh = [False] * cameras
        self._grouped = [-1] * cameras  # stamps of the frames in the last published group

    def frame_arrived(self, index: int, stamp_ns: int, now_ns: int, max_age_s: float, has_state: bool) -> Decision:
        """Camera ``index`` delivered a good frame stamped ``stamp_ns``; ``has_state``: a valid
        state is held now."""
        self.stamps[index] = stamp_ns
        if stamp_ns != self._grouped[index]:
            self._fresh[index] = True
        return self._decide(now_ns, max_age_s, has_state)

    def state_arrived(self, now_ns: int, max_age_s: float) -> Decision:
        """A valid state arrived: frames held back for want of one go out now (a camera
        publishes its state right after its image, so the frame that found no valid state,
        the first after a drop-out or after a rejected state, need not wait a camera period
        for the next one)."""
        return self._decide(now_ns, max_age_s, True)

    def _decide(self, now_ns: int, max_age_s: float, has_state: bool) -> Decision:
        if not all(self._fresh):
            return Decision(WAIT)
        max_age_ns = round(max_age_s * 1e9)
        stale = tuple(i for i, s in enumerate(self.stamps) if now_ns - s > max_age_ns)
        if stale:
            for i in stale:
                self._fresh[i] = False
            return Decision(STALE, stale)
        if self.needs_state and not has_state:
            return Decision(NO_STATE)
        return Decision(PUBLISH)

    def published(self) -> None:
        """The group of the newest frames went out: each camera needs a newer frame."""
        self._fresh = [False] * len(self._fresh)
        self._grouped = [int(s) for s in self.stamps]


__all__ = ["NO_STATE", "PUBLISH", "STALE", "WAIT", "Decision", "FrameGrouping"]
