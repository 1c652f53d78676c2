"""The robot state a camera node groups with its images, from JointState messages (no ROS).

:class:`StateTracker` takes each message's joint names and positions and holds the
state the next group gets:

* without ``joint_names`` the state is each message's positions in the order of
  the first message's joint names (:attr:`StateTracker.order`; one publisher on
  the topic): a later message that names the same joints in another order is
  put in that order, one that names other joints is refused (set ``joint_names``
  to pick joints by name), and one without names is taken in its own order;
* with ``joint_names`` it is the positions of those joints, in that order. A
  message gives the named joints it carries (an arm's driver and a gripper's on
  one topic each give theirs; joints not named are ignored), and the state is
  there once every named joint has a position. A message with none of them
  changes nothing;
* a state older than ``max_age`` (by arrival: drivers' header stamps are not
  always set) is no state: a driver that stopped is not forwarded for ever;
* ``stamp_ns`` is the stamp of the newest message taken (its header stamp, or
  its arrival when that is not set): the grouping pairs states with frames by it;
* a bad message (no positions, names and positions disagreeing, a named
  position not finite, too many values) is refused with its reason, and the
  state it would have replaced is dropped (with ``joint_names``, the positions
  of the joints it names): an older state is never forwarded as if it were
  current. With ``joint_names``, a message that names none of them is another
  driver's and changes nothing, however it is (a conveyor's velocities without
  positions refused every message and wiped the arm's state).

Times are integer nanoseconds on one clock (the node's).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


#: joint names of the messages kept, to say which a missing joint is not among
SEEN_KEPT = 16


class StateTracker:
    """See the module doc; ``max_values``: the most positions a state may have."""

    def __init__(self, joint_names: Sequence[str] = (), max_values: int = 32):
        if len(set(joint_names)) != len(joint_names) or not all(joint_names):
            raise ValueError(f"joint names must be unique and non-empty, got {list(joint_names)}")
        self.joint_names = tuple(joint_names)
        self.max_values = max_values
        self._values: dict[str, tuple[float, int]] = {}  # joint -> (position, arrival)
        self._state: tuple[np.ndarray, int] | None = None  # without names: (positions, arrival)
        self.stamp_ns: int | None = None  # the newest message taken: its stamp (or its arrival)
        self._refused: str | None = None  # why the last message was refused, if it was
        self._seen: dict[str, None] = {}  # the joint names messages carried (the first SEEN_KEPT), in order
        #: without joint names: the joint names of the first message taken, whose order the state keeps
        self.order: tuple[str, ...] | None = None

    def update(self, names: Sequence[str], positions: Sequence[float], now_ns: int,
               stamp_ns: int = 0) -> tuple[str, str] | None:
        """A message stamped ``stamp_ns`` (0: not set) arrived: None when taken (or, with joint
        names, when it carries none of them), else (reason, text) of its refusal."""
        values = np.asarray(positions, dtype=np.float64)
        names = list(names)
        if self.joint_names:
            for name in names:
                if len(self._seen) < SEEN_KEPT:
                    self._seen.setdefault(name)
            if names and not set(names) & set(self.joint_names):
                return None  # another driver's joints, however its message is: not ours to judge
        refusal = self._check(names, values)
        if refusal is not None:
            if self.joint_names:  # the joints it names are not known now; another driver's stay
                for name in names:
                    self._values.pop(name, None)
            else:
                self._values.clear()
            self._state = None
            self._refused = refusal[1]
            return refusal
        self._refused = None
        if not self.joint_names:
            if names and self.order is None:
                self.order = tuple(names)
            if names and tuple(names) != self.order:  # the same joints (checked), in another order
                values = np.array([values[names.index(name)] for name in self.order])
            self._state = (values.astype(np.float32), now_ns)
        else:
            named = [(name, value) for name, value in zip(names, values.tolist()) if name in self.joint_names]
            self._values.update((name, (value, now_ns)) for name, value in named)
        self.stamp_ns = stamp_ns or now_ns
        return None

    def _check(self, names: list[str], values: np.ndarray) -> tuple[str, str] | None:
        if values.size == 0:
            return "state_empty", "JointState has no position values"
        if names and len(names) != values.size:
            return "state_names_mismatch", f"{len(names)} joint names for {values.size} positions"
        if not self.joint_names and len(set(names)) != len(names):
            return "state_names_mismatch", f"a joint named twice in {names}: which position is whose?"
        if self.joint_names and not names:
            return "state_names_mismatch", "JointState has positions but no joint names; state_joint_names " \
                                           "picks joints by name"
        taken = values if not self.joint_names else np.array(
            [v for n, v in zip(names, values.tolist()) if n in self.joint_names])
        if not self.joint_names and values.size > self.max_values:
            return "state_too_long", f"{values.size} positions, at most {self.max_values} supported"
        if not np.all(np.isfinite(taken)):
            return "state_not_finite", f"positions contain NaN or infinite values: {taken.tolist()}"
        if not self.joint_names and names and self.order is not None and sorted(names) != sorted(self.order):
            return "state_names_changed", (f"JointState names {names}, not the joints of the first message "
                                           f"{list(self.order)}, whose order the state keeps; two publishers on "
                                           "the topic? state_joint_names picks joints by name")
        return None

    def current(self, now_ns: int, max_age_s: float) -> np.ndarray | None:
        """The state to group now (float32), or None: none yet, a named joint missing, or older
        than ``max_age_s``."""
        oldest = now_ns - max_age_s * 1e9  # float: max_age_s may be inf
        if not self.joint_names:
            if self._state is None or self._state[1] < oldest:
                return None
            return self._state[0]
        if len(self._values) < len(self.joint_names):
            return None
        if min(arrival for _, arrival in self._values.values()) < oldest:
            return None
        return np.array([self._values[n][0] for n in self.joint_names], dtype=np.float32)

    def missing(self, now_ns: int, max_age_s: float) -> str:
        """Why there is no state now, for a log line ("" when there is one, or none ever came)."""
        if self.current(now_ns, max_age_s) is not None:
            return ""
        if self._refused is not None:
            return f"the last message was refused: {self._refused}"
        oldest = now_ns - max_age_s * 1e9  # float: max_age_s may be inf
        if self.joint_names:
            absent = [n for n in self.joint_names if n not in self._values]
            if absent:
                carried = f"; the messages name {list(self._seen)}" if self._seen else ""
                return f"no position yet of joint(s) {absent}{carried}"
            old = [n for n in self.joint_names if self._values[n][1] < oldest]
            return f"joint(s) {old} older than {max_age_s:g} s"
        if self._state is None:
            return ""
        return f"the newest state is {(now_ns - self._state[1]) / 1e9:.2f} s old (over {max_age_s:g} s)"


__all__ = ["StateTracker"]
