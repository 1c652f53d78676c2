"""``oxygen-record``: record ROS 2 topics into a rosbag2 bag, without the ``ros2`` command.

The pip-only set-up of ``make`` has no ``ros2 bag record``; this records what
the bag player (``bag_player``) and the replay tests play back::

    .venv/bin/oxygen-record my_bag --duration 30                         # every topic
    .venv/bin/oxygen-record my_bag /camera/image_raw /joint_states /oxygen/instruction

It subscribes to the topics named (by default every topic it sees but
``/rosout``, ``/parameter_events`` and hidden ones such as an action's
``_action/feedback``), also those that appear while it records, and writes each message as it arrived: its serialized bytes (exactly
what went over the wire) and the time it was received, as ``ros2 bag record``
does. Each subscription takes its publishers' QoS: reliable when every
publisher is, and transient-local when every publisher is (a latched topic,
such as the instruction: it is stored as latched and the player re-publishes
it latched). It ends ``--duration`` seconds after the first message (with none,
that long after it last found a topic to record, or after its start), or on
Ctrl-C / SIGTERM / SIGHUP (its terminal closed),
closes the bag and prints what it holds; exit status 1 when it recorded
nothing (the bag is left, empty, so that nothing is overwritten silently).
The bag is written in files of ``--segment-s`` seconds, each listed as it
closes (:mod:`oxygen_ros.ros.bag_segments`): killed outright, it loses only
the last.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from .arguments import non_negative_float, output_dir, plain, positive_float

#: Topics not recorded unless named: every node's logs and parameter events.
SKIPPED = ("/rosout", "/parameter_events")
#: Seconds between two looks for new topics.
DISCOVERY_PERIOD_S = 0.5
#: Seconds per file of a bag (--segment-s): what a recording killed outright loses at most.
SEGMENT_S = 30.0


def topic_name(text: str) -> str:
    """A fully qualified topic name (``/camera/image_raw``)."""
    from rclpy.validate_full_topic_name import validate_full_topic_name

    try:
        validate_full_topic_name(text)
    except Exception as exc:  # InvalidTopicNameException, or rcl's ValueError
        raise argparse.ArgumentTypeError(f"{text!r} is not a fully qualified topic name: "
                                         f"{str(exc).splitlines()[0]}") from None
    return text


def new_bag_dir(text: str) -> Path:
    """Where the bag goes: a folder that does not exist yet (a bag is never written over)."""
    path = Path(text)
    if path.exists():
        raise argparse.ArgumentTypeError(f"{path} exists already; a bag is written to a new folder")
    return output_dir(text)  # and a place it can be made in


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked (argparse exits with status 2 naming a bad option)."""
    parser = argparse.ArgumentParser(prog="oxygen-record", description=plain(__doc__.split("\n\n")[0]))
    parser.add_argument("out", type=new_bag_dir, help="the bag's folder (must not exist)")
    parser.add_argument("topics", nargs="*", type=topic_name,
                        help=f"topics to record (default: every topic but {', '.join(SKIPPED)} and hidden ones, "
                             "such as an action's _action/feedback)")
    parser.add_argument("--duration", type=positive_float, default=None,
                        help="seconds to record from the first message received (default: until Ctrl-C or "
                             "SIGTERM)")
    parser.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap", help="bag storage (default mcap)")
    parser.add_argument("--segment-s", type=non_negative_float, default=SEGMENT_S,
                        help=f"seconds per file of the bag (default {SEGMENT_S:g}): each is closed and listed in "
                             "metadata.yaml as it ends, so that a recording killed outright (SIGKILL, out of memory, "
                             "power lost) keeps all but the last; 0: one file, readable only once the bag is closed")
    return parser.parse_intermixed_args(argv)  # options anywhere: before, between or after the topics


class Recorder:
    """Subscriptions that write every message they get into ``bag`` (a :class:`~..ros.bags.BagWriter`)."""

    def __init__(self, node, bag, topics: Sequence[str]):
        from rclpy.clock import Clock, ClockType

        self.node, self.bag = node, bag
        self.wanted = set(topics)  # empty: every topic but SKIPPED
        self.counts: Counter = Counter()
        #: time.monotonic() when the last topic to record was found (None: none yet)
        self.last_found: float | None = None
        self._subscriptions: dict[str, object] = {}
        self.discover()
        # steady time: a ROS-time timer stands still while the system clock is stepped back
        node.create_timer(DISCOVERY_PERIOD_S, self.discover, clock=Clock(clock_type=ClockType.STEADY_TIME))

    def discover(self) -> None:
        """Subscribe to the wanted topics that have a publisher now (once each)."""
        for topic, types in self.node.get_topic_names_and_types():
            if topic in self._subscriptions or not self._wants(topic):
                continue
            publishers = self.node.get_publishers_info_by_topic(topic)
            if not publishers:
                continue
            if len(set(types)) != 1:
                self.node.get_logger().warning(f"{topic} carries several types {types}: not recorded")
                self._subscriptions[topic] = None
                continue
            try:
                self._subscribe(topic, types[0], publishers)
            except ValueError as exc:  # BagError: a type with no definition here
                self.node.get_logger().warning(f"{topic} not recorded: {exc}")
                self._subscriptions[topic] = None

    def _wants(self, topic: str) -> bool:
        """Named, or (none named) any topic but :data:`SKIPPED` and the hidden ones (a name part
        starting with ``_``: an action's feedback and status, as ``ros2 bag record -a``)."""
        if self.wanted:
            return topic in self.wanted
        return topic not in SKIPPED and not any(part.startswith("_") for part in topic.split("/"))

    def _subscribe(self, topic: str, msgtype: str, publishers) -> None:
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

        from ..ros.bags import message_class

        reliable = all(p.qos_profile.reliability == ReliabilityPolicy.RELIABLE for p in publishers)
        latched = all(p.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL for p in publishers)
        qos = QoSProfile(depth=1000 if reliable else 100,
                         reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE)
        self.bag.add_topic(topic, msgtype, latched=latched)
        clock = self.node.get_clock()

        def on_message(raw: bytes) -> None:
            self.bag.write(topic, clock.now().nanoseconds, raw)
            self.counts[topic] += 1

        self._subscriptions[topic] = self.node.create_subscription(message_class(msgtype), topic, on_message, qos,
                                                                   raw=True)
        self.last_found = time.monotonic()
        self.node.get_logger().info(f"recording {topic} ({msgtype}, {'reliable' if reliable else 'best effort'}"
                                    f"{', latched' if latched else ''})")


def end_time(duration: float | None, started: float, last_found: float | None,
             first_message: float | None) -> float | None:
    """When a recording of ``duration`` seconds ends (None: on a signal only): that long after the
    first message; until one comes, after the last topic found (the publishers of a starting
    agent are found over its first seconds, and a topic found late gets the whole duration to
    say something) or after the start."""
    if duration is None:
        return None
    return duration + (first_message if first_message is not None else
                       last_found if last_found is not None else started)


def record(args: argparse.Namespace) -> int:
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    from ..ros.bag_segments import SegmentedBagWriter
    from ..ros.bags import BagError, BagWriter

    stop = []  # a signal ends the loop between two callbacks: never inside the bag's write
    ignored = []
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGHUP: its terminal closed (ssh dropped)
        if signal.getsignal(signum) is not signal.SIG_IGN:  # ignored (nohup, a background job): it stays so
            signal.signal(signum, lambda n, _: stop.append(signal.Signals(n).name))
        else:
            ignored.append(signal.Signals(signum).name)
    if "SIGINT" in ignored:  # (a script's `cmd &` starts it so: `kill -INT` would do nothing, without a word)
        print(f"oxygen-record: {' and '.join(ignored)} ignored, as this process was started (a background job of "
              "a script, nohup): stop it with SIGTERM (kill PID) or --duration", file=sys.stderr, flush=True)
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    try:
        bag = (SegmentedBagWriter(args.out, args.storage, args.segment_s) if args.segment_s
               else BagWriter(args.out, args.storage))
    except BagError as exc:
        rclpy.try_shutdown()
        print(f"oxygen-record: {exc}", file=sys.stderr)
        return 2
    node = rclpy.create_node("oxygen_record")
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    started = time.monotonic()
    counts: Counter = Counter()
    try:
        recorder = Recorder(node, bag, args.topics)
        counts = recorder.counts
        first_message = None
        while not stop:
            executor.spin_once(timeout_sec=0.1)
            if first_message is None and counts:
                first_message = time.monotonic()
            end = end_time(args.duration, started, recorder.last_found, first_message)
            if end is not None and time.monotonic() >= end:
                break
    finally:
        bag.close()
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return _summary(args.out, counts, args.topics)


def _summary(out: Path, counts: Counter, wanted: Sequence[str]) -> int:
    missing = [t for t in wanted if not counts[t]]
    total = sum(counts.values())
    print(f"oxygen-record: {out}: {total} messages on {len(counts)} topic(s)"
          + "".join(f"\n  {topic}: {n}" for topic, n in sorted(counts.items())), flush=True)
    if missing:
        print(f"oxygen-record: nothing received on {', '.join(missing)}", file=sys.stderr)
    return 0 if total else 1


def main(argv: Sequence[str] | None = None) -> int:
    return record(parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
