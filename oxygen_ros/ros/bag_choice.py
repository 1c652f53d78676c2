"""Which of a bag's topics the bag player plays, and what it says of the others.

By default every recorded topic but ``exclude_topics`` (:data:`OWN_TOPICS`: the
stack's own outputs and ROS's bookkeeping); with ``topics``, those. The player
refuses to play the ActionChunks it waits on in lockstep however they were
chosen, and warns of an ``exclude_topics`` of one's own that lets the stack's
outputs through (it replaces the default list), of an excluded name the bag
does not hold, and of a topic asked for that is not in the bag.
"""

from __future__ import annotations

from typing import Any

from .lockstep import gate_topics

#: Topics a bag of a running agent holds (``ros2 bag record -a``) that are not the robot's inputs: the
#: stack's own outputs and ROS's bookkeeping. Played, they would reach the robot beside the live ones
#: (recorded actions), feed the inference node twice (recorded Observations) or answer the player's
#: own lockstep; a recorded /clock disagrees with the restamped headers; a lifecycle node's recorded
#: transition events (``/oxygen_inference/transition_event``) would tell a live lifecycle manager of
#: transitions that never happened.
OWN_TOPICS = ["/oxygen/actions", "/oxygen/joint_trajectory", "/oxygen/observation", "/oxygen/text", "/diagnostics",
              "/rosout", "/parameter_events", "/clock", "/transition_event"]


def excluded(topic: str, exclude: list[str]) -> bool:
    """Whether ``topic`` is one of ``exclude`` or one of them under a namespace (``/left/oxygen/actions``)."""
    return any(topic == e or topic.endswith(e) for e in exclude)


def checked_choice(p: dict[str, Any], recorded: dict, wanted: list[str], log) -> tuple[str, str] | None:
    """(the parameter to blame, why) when ``wanted`` (of the bag's ``recorded`` topics, chosen by
    the player's parameters ``p``) holds the ActionChunks the player waits on in lockstep: played,
    the bag's own chunks would answer its images. Else None, after logging (``log``, the node's
    logger) what is left out, an excluded name the bag does not hold (a typo?), the stack's own
    outputs played, and the topics asked for that the bag lacks."""
    gated = sorted(set(gate_topics(p["action_topic"], p["lockstep_robots"]).values()) & set(wanted))
    if gated:
        return ("topics" if p["topics"] else "exclude_topics",
                f"{gated} carry the ActionChunks this player waits on in lockstep: played, the bag's own chunks "
                "would answer its images")
    if not p["topics"]:
        left_out = sorted(set(recorded) - set(wanted))
        if left_out:
            log.info(f"not playing {left_out} (exclude_topics)")
        unknown = [e for e in p["exclude_topics"]
                   if e not in OWN_TOPICS and not any(excluded(t, [e]) for t in recorded)]
        if unknown:
            log.warning(f"exclude_topics names {unknown}, which the bag does not hold (it has {sorted(recorded)})")
        own = [t for t in wanted if excluded(t, OWN_TOPICS)]
        if own:
            log.warning(f"playing {own}, the stack's own outputs or ROS's bookkeeping as recorded: an exclude_topics "
                        "of your own replaces the default list (add them back to it, or a robot and the inference "
                        "node get the bag's old messages beside the live ones)")
    missing = [t for t in wanted if t not in recorded]
    if missing:
        log.warning(f"topics {missing} are not in the bag (it has {sorted(recorded)})")
    return None


def nothing_to_play(p: dict[str, Any], recorded: dict, wanted: list[str]) -> tuple[str, str]:
    """(the parameter to blame, why) when no topic of the bag can be played."""
    if p["topics"]:
        return "topics", (f"nothing to play: none of {wanted} is in the bag with a type that can be read here "
                          "(the warnings above say why)")
    if not recorded:
        return "bag_path", f"nothing to play: {p['bag_path']} holds no topic (a recording that received nothing)"
    if not wanted:
        return "exclude_topics", f"nothing to play: every topic of the bag is excluded ({sorted(recorded)})"
    return "bag_path", (f"nothing to play: no message type of the bag's topics can be read here ({wanted}; the "
                        "warnings above say why)")


__all__ = ["OWN_TOPICS", "checked_choice", "excluded", "nothing_to_play"]
