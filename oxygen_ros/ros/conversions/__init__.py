"""Conversions between ROS messages and the core's numpy / dataclass types, one concept per module.

* :mod:`.stamps` - ``builtin_interfaces/Time`` from and to nanoseconds, seconds
  and ``rclpy.time.Time``; the ``Header`` of outgoing messages.
* :mod:`.image_checks` - every way an ``Image`` / ``CompressedImage`` can be
  malformed, checked before a decoder sees it: :class:`ImageError`, whose
  ``reason`` is one of :data:`IMAGE_ERROR_REASONS`; :func:`check_png_data`, a
  PNG's integrity (CRCs, zlib stream).
* :mod:`.images` - image messages <-> ``HxWx3`` uint8 RGB (checked, then
  cv_bridge, simplejpeg or OpenCV), and the resize to the model's square resolution.
* :mod:`.observations` - the ``oxygen_ros/Observation`` message <->
  :class:`oxygen_ros.core.observation.Observation`.
* :mod:`.outputs` - the inference node's ``ActionChunk``, ``TextToken`` and
  ``JointTrajectory`` messages.

This package's namespace holds the public names of all five.
"""

from .image_checks import (
    DEFAULT_MAX_IMAGE_BYTES,
    IMAGE_ERROR_REASONS,
    SUPPORTED_COMPRESSED_FORMATS,
    SUPPORTED_ENCODINGS,
    ImageError,
    check_compressed_msg,
    check_image_msg,
    check_png_data,
)
from .images import (
    compressed_msg_to_rgb,
    core_observation,
    image_msg_to_rgb,
    rgb_to_compressed_msg,
    rgb_to_image_msg,
    to_model_image,
)
from .observations import msg_to_observation, observation_to_msg
from .outputs import action_chunk_array, action_chunk_msg, joint_trajectory_msg, text_token_msg
from .stamps import duration_msg, header_msg, ns_to_time_msg, stamp_to_ns, time_msg_seconds, to_time_msg

__all__ = [
    "DEFAULT_MAX_IMAGE_BYTES", "IMAGE_ERROR_REASONS", "SUPPORTED_COMPRESSED_FORMATS", "SUPPORTED_ENCODINGS",
    "ImageError", "check_compressed_msg", "check_image_msg", "check_png_data",
    "compressed_msg_to_rgb", "core_observation", "image_msg_to_rgb", "rgb_to_compressed_msg", "rgb_to_image_msg",
    "to_model_image",
    "msg_to_observation", "observation_to_msg",
    "action_chunk_array", "action_chunk_msg", "joint_trajectory_msg", "text_token_msg",
    "duration_msg", "header_msg", "ns_to_time_msg", "stamp_to_ns", "time_msg_seconds", "to_time_msg",
]
