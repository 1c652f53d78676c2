"""The QoS profiles the nodes share (not parameters: fixed choices, one place)."""

from __future__ import annotations

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy


def _profile(depth: int, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE) -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, reliability=reliability, durability=durability)


def reliable(depth: int) -> QoSProfile:
    """Reliable, volatile, the last ``depth`` messages."""
    return _profile(depth)


#: QoS of latched topics (the instruction): the last message reaches late joiners.
LATCHED_QOS = _profile(1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
#: QoS of the Observation output: reliable, volatile, a short queue.
OBSERVATION_QOS = reliable(5)
#: QoS of the inference node's Observation input: the newest one only. A frame uses a
#: robot's newest observation; after its executor could not take messages for a while
#: (at the start, before it spins) a deeper queue handed it the older ones first, and a
#: frame went to each, on a chunk whose rows were already in the past when it came.
OBSERVATION_INPUT_QOS = reliable(1)
#: Subscriptions to ActionChunks are best effort: that matches reliable and
#: best-effort publishers alike; a lost chunk costs one step (or one lockstep timeout).
ACTIONS_QOS = _profile(10, reliability=ReliabilityPolicy.BEST_EFFORT)
#: Published data (images, joint states, replayed topics): reliable, which every
#: subscriber (reliable or best effort) accepts.
DATA_QOS = reliable(10)
#: The Ask action's services (goal, result, cancel) and feedback: rclpy's default service
#: queue keeps 10 requests, and a client that sent 40 goals at once lost all past the tenth
#: (no response, no refusal). Deep enough for any burst the node's queue_limit then refuses.
ASK_QOS = reliable(1000)


#: The reliabilities an image subscription can ask for (``image_reliability``).
RELIABILITY = ("best_effort", "reliable")


def image_qos(reliability: str, depth: int) -> QoSProfile:
    """A camera image subscription: ``reliability`` (one of :data:`RELIABILITY`), volatile, the last ``depth``."""
    policy = ReliabilityPolicy.RELIABLE if reliability == "reliable" else ReliabilityPolicy.BEST_EFFORT
    return _profile(depth, reliability=policy)


def is_reliable(profile: QoSProfile) -> bool:
    return profile.reliability == ReliabilityPolicy.RELIABLE


#: What to check when nothing publishes on a topic the node subscribes to (cameras, the state).
NO_PUBLISHER_CHECKS = "(a remapping, the robot's namespace), or that its driver runs"

#: Images from this size on go out in several UDP fragments, and a best-effort subscription
#: loses the whole image with any one of them (below it, QoS is not why a camera is slow).
FRAGMENT_BYTES = 64_000


def image_qos_hint(topic: str, subscription: QoSProfile, image_bytes: int | None,
                   publishers: list[QoSProfile]) -> str:
    """For a slow camera on ``topic``: that nothing publishes there, when ``publishers`` is
    empty (a typo, a namespace); the hint to subscribe reliable, when its ``publishers`` are
    all reliable, the ``subscription`` best effort and its last image (``image_bytes``, None:
    none came) large; to send compressed images or publish reliable, when images came large
    from a best-effort publisher; else ''."""
    if not publishers:
        return f"; nothing publishes on {topic}: check the topic's name {NO_PUBLISHER_CHECKS}"
    if is_reliable(subscription) or (image_bytes is not None and image_bytes < FRAGMENT_BYTES):
        return ""  # images of one datagram each (best effort loses no part of one), or not its QoS
    if not all(is_reliable(p) for p in publishers):
        if image_bytes is None:
            return ""
        return (f"; its images are large ({image_bytes / 1e3:.0f} kB) and its publisher best effort, which loses "
                "a whole image with any fragment: send compressed images, or publish reliable and set "
                "image_reliability: reliable")
    fix = (f"set image_reliability: reliable (or qos_overrides.{topic}.subscription.reliability: reliable), "
           "or send compressed images")
    if image_bytes is None:  # nothing came: lost in fragments, or not sent yet (a player waiting to start)
        return (f"; its publisher is reliable and this subscription best effort: if it sends large raw images, "
                f"best effort can lose every one: {fix}")
    return f"; its publisher is reliable and this subscription best effort, which loses large raw images: {fix}"
