"""ROS times: ``builtin_interfaces/Time`` from and to nanoseconds, seconds and ``rclpy.time.Time``.

Wherever a stamp is taken it may be a ``builtin_interfaces/Time``, an
``rclpy.time.Time`` or a number of **seconds** (int or float):
:func:`to_time_msg` does the conversion, :func:`stamp_to_ns` /
:func:`ns_to_time_msg` convert to and from integer nanoseconds, and
:func:`header_msg` builds the ``std_msgs/Header`` every outgoing message carries.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from builtin_interfaces.msg import Duration, Time
from std_msgs.msg import Header


def ns_to_time_msg(ns: int) -> Time:
    """Integer nanoseconds -> ``builtin_interfaces/Time`` (must be >= 0)."""
    ns = int(ns)
    if ns < 0:
        raise ValueError(f"a ROS time cannot be negative, got {ns} ns")
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def stamp_to_ns(stamp: Time) -> int:
    """``builtin_interfaces/Time`` -> integer nanoseconds."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def to_time_msg(stamp: Any) -> Time:
    """A ``Time`` message from a ``Time`` message, an ``rclpy.time.Time`` or seconds."""
    if isinstance(stamp, Time):
        return stamp
    if hasattr(stamp, "to_msg") and hasattr(stamp, "nanoseconds"):  # rclpy.time.Time
        return stamp.to_msg()
    if isinstance(stamp, (int, float, np.integer, np.floating)) and not isinstance(stamp, bool):
        seconds = float(stamp)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"a stamp in seconds must be finite and >= 0, got {stamp!r}")
        whole = math.floor(seconds)  # split first: seconds * 1e9 would lose the nanoseconds
        return ns_to_time_msg(whole * 1_000_000_000 + round((seconds - whole) * 1e9))
    raise TypeError(f"expected a builtin_interfaces/Time, rclpy Time or seconds, got {type(stamp).__name__}")


def time_msg_seconds(stamp: Time) -> float:
    """``builtin_interfaces/Time`` -> seconds (float)."""
    return stamp.sec + stamp.nanosec * 1e-9


def duration_msg(seconds: float) -> Duration:
    """Seconds -> ``builtin_interfaces/Duration`` (rounded to the nanosecond)."""
    ns = round(seconds * 1e9)
    return Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def header_msg(stamp: Any, frame_id: str = "") -> Header:
    """A ``std_msgs/Header`` with ``stamp`` (anything :func:`to_time_msg` takes) and ``frame_id``."""
    return Header(stamp=to_time_msg(stamp), frame_id=str(frame_id))
