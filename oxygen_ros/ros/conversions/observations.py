"""The ``oxygen_ros/Observation`` message <-> :class:`oxygen_ros.core.observation.Observation`."""

from __future__ import annotations

import array
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from std_msgs.msg import Header

from oxygen_ros.msg import Observation as ObservationMsg

from .image_checks import DEFAULT_MAX_IMAGE_BYTES, ImageError
from .images import core_observation, image_msg_to_rgb, rgb_to_image_msg, to_model_image
from .stamps import header_msg, time_msg_seconds

if TYPE_CHECKING:
    from oxygen_ros.core.observation import Observation


def observation_to_msg(
    observation: Observation,
    seq: int,
    *,
    stamp: Any = None,
    frame_id: str = "",
    image_size: int | None = None,
    image_headers: Mapping[str, Header] | None = None,
) -> ObservationMsg:
    """An :class:`Observation` as an ``oxygen_ros/Observation`` message.

    ``stamp`` (default ``observation.stamp``, seconds) should be the capture
    time of the oldest image. Images are resized to ``image_size`` (aspect kept,
    black padding) when given, and sent as rgb8 in the observation's camera
    order; ``image_headers`` gives each camera image's header (default: the
    observation's stamp and an empty frame id).
    """
    if int(seq) < 0:
        raise ValueError(f"seq must be >= 0, got {seq}")
    header = header_msg(observation.stamp if stamp is None else stamp, frame_id)
    msg = ObservationMsg(header=header, seq=int(seq), instruction=observation.instruction)
    names, images = [], []
    for name, rgb in observation.images.items():
        if image_size is not None:
            rgb = to_model_image(rgb, image_size)
        own = (image_headers or {}).get(name)
        img = rgb_to_image_msg(rgb, "rgb8", own.stamp if own is not None else header.stamp,
                               own.frame_id if own is not None else "")
        names.append(name)
        images.append(img)
    msg.camera_names = names
    msg.images = images
    state = observation.state
    msg.state = array.array("f", np.zeros(0, np.float32).tobytes() if state is None
                            else np.asarray(state, dtype=np.float32).tobytes())
    return msg


def msg_to_observation(msg: ObservationMsg, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> Observation:
    """An ``oxygen_ros/Observation`` message as an :class:`Observation`.

    Raises :class:`ObservationError` for a malformed group (a negative stamp, names
    and images disagreeing, duplicate names, bad state) and :class:`ImageError` for a bad
    image. ``meta`` holds ``seq``, ``frame_id`` and ``image_stamps`` (seconds).
    """
    core = core_observation()
    ObservationError = core.ObservationError
    if msg.header.stamp.sec < 0:  # no ROS time: the chunk's observation_stamp could not carry it back out
        raise ObservationError("header.stamp", f"is negative ({time_msg_seconds(msg.header.stamp):.3f} s, before "
                               "1970): stamp it with the capture time (0: none)")
    names, images = list(msg.camera_names), list(msg.images)
    if len(names) != len(images):
        raise ObservationError("camera_names", f"{len(names)} names for {len(images)} images")
    if len(set(names)) != len(names):
        raise ObservationError("camera_names", f"duplicate camera names in {names}")
    decoded = {}
    for name, img in zip(names, images):
        try:
            decoded[name] = image_msg_to_rgb(img, max_bytes)
        except ImageError as exc:
            raise ImageError(exc.reason, f"camera {name!r}: {exc.detail}") from exc
    state = np.frombuffer(msg.state, dtype=np.float32).copy() if len(msg.state) else None
    return core.Observation(
        images=decoded,
        instruction=msg.instruction,
        state=state,
        stamp=time_msg_seconds(msg.header.stamp),
        meta={
            "seq": int(msg.seq),
            "frame_id": msg.header.frame_id,
            "image_stamps": {n: time_msg_seconds(i.header.stamp) for n, i in zip(names, images)},
        },
    )
