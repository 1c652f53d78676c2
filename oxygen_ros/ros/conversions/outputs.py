"""The inference node's output messages: ``ActionChunk``, ``TextToken``, ``JointTrajectory``."""

from __future__ import annotations

import array
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from oxygen_ros.msg import ActionChunk, TextToken

from .stamps import duration_msg, header_msg, ns_to_time_msg, to_time_msg


def _actions_2d(actions: Any) -> np.ndarray:
    a = np.asarray(actions, dtype=np.float32)
    if a.ndim != 2:
        raise ValueError(f"actions must be a [horizon, action_dim] matrix, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError("actions contain NaN or infinite values")
    return np.ascontiguousarray(a)


def _period(control_period: float) -> float:
    period = float(control_period)
    if not math.isfinite(period) or period <= 0:
        raise ValueError(f"control_period must be a finite number of seconds > 0, got {control_period!r}")
    return period


def action_chunk_msg(
    header_stamp: Any,
    frame_id: int,
    observation_seq: int,
    observation_stamp: Any,
    offset: int,
    control_period: float,
    actions: np.ndarray,
    *,
    header_frame_id: str = "",
) -> ActionChunk:
    """An ``ActionChunk``: row ``i`` of ``actions`` ([horizon, action_dim]) is due at
    ``header_stamp + i * control_period``. ``frame_id`` is the engine's frame
    counter (the message's uint64 ``frame_id``); ``header_frame_id`` is the
    robot/control frame that goes into ``header.frame_id``."""
    a = _actions_2d(actions)
    for name, value in (("frame_id", frame_id), ("observation_seq", observation_seq), ("offset", offset)):
        if int(value) < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    msg = ActionChunk(
        header=header_msg(header_stamp, header_frame_id),
        frame_id=int(frame_id),
        observation_seq=int(observation_seq),
        observation_stamp=to_time_msg(observation_stamp),
        offset=int(offset),
        control_period=_period(control_period),
        horizon=a.shape[0],
        action_dim=a.shape[1],
    )
    msg.actions = array.array("f", a.tobytes())
    return msg


def action_chunk_array(msg: ActionChunk) -> np.ndarray:
    """The actions of an ``ActionChunk`` as a float32 ``[horizon, action_dim]`` array."""
    a = np.asarray(msg.actions, dtype=np.float32)
    if a.size != msg.horizon * msg.action_dim:
        raise ValueError(f"ActionChunk has {a.size} values, horizon {msg.horizon} x action_dim {msg.action_dim} expected")
    return a.reshape(msg.horizon, msg.action_dim)


def text_token_msg(stamp: Any, event: Any, *, header_frame_id: str = "", observation_seq: int = 0,
                   observation_stamp_ns: int = 0) -> TextToken:
    """A ``TextToken`` from a :class:`oxygen_ros.core.requests.TokenEvent`, with the seq and stamp
    of the observation its request reads (0: none, a question refused before it was a request)."""
    reason = getattr(event.finish_reason, "value", event.finish_reason) or ""
    return TextToken(
        header=header_msg(stamp, header_frame_id),
        request_id=int(event.request_id),
        client_id=str(event.client_id),
        frame_id=int(event.frame_id),
        observation_seq=int(observation_seq),
        observation_stamp=ns_to_time_msg(observation_stamp_ns),
        index=int(event.index),
        token_id=int(event.token_id),
        piece=str(event.piece),
        done=bool(event.done),
        finish_reason=str(reason),
        reason=str(event.detail),
    )


def joint_trajectory_msg(
    stamp: Any,
    joint_names: Sequence[str],
    actions: np.ndarray,
    control_period: float,
    *,
    frame_id: str = "",
) -> JointTrajectory:
    """A ``trajectory_msgs/JointTrajectory`` with one point per action row.

    Row ``i`` becomes the point's ``positions`` with ``time_from_start = i *
    control_period`` (so the header stamp is when row 0 is due, as in
    ``ActionChunk``). ``joint_names`` must name every column.
    """
    a = _actions_2d(actions)
    names = [str(n) for n in joint_names]
    if len(names) != a.shape[1]:
        raise ValueError(f"{len(names)} joint names for actions with {a.shape[1]} columns")
    if len(set(names)) != len(names) or not all(names):
        raise ValueError(f"joint names must be unique and non-empty, got {names}")
    period = _period(control_period)
    msg = JointTrajectory(header=header_msg(stamp, frame_id), joint_names=names)
    points = []
    for i, row in enumerate(a.astype(np.float64)):
        point = JointTrajectoryPoint(time_from_start=duration_msg(i * period))
        point.positions = array.array("d", row.tobytes())
        points.append(point)
    msg.points = points
    return msg
