"""The inference node's text output (oxygen_ros/ros/text_output.py), on a real rclpy node:
every event goes out as a TextToken, ends without a token included, and the token rate
(``tokens_per_s`` in the diagnostics) counts the tokens only."""

import collections
import time

from ros_harness import reliable, unique_prefix, until

from oxygen_ros.core.requests import TokenEvent


def token(request_id, index, token_id, piece, done=False, reason=""):
    return TokenEvent(request_id, "", 1, index, token_id, piece, done, reason)


def _output_and_subscriber(ros, name: str):
    """A TextOutput on a node of its own, and the TextTokens a subscriber (matched) receives from it."""
    from oxygen_ros.msg import TextToken
    from oxygen_ros.ros.text_output import TextOutput

    topic = f"{unique_prefix()}/text"
    node = ros.node(name)
    output = TextOutput(node, topic, collections.Counter())
    got = []
    ros.node(f"{name}_sub").create_subscription(TextToken, topic, got.append, reliable(100))
    assert until(lambda: node.count_subscribers(topic) == 1)
    return output, got


def test_the_token_rate_counts_tokens_not_the_ends_without_one(ros):
    from oxygen_ros.ros.text_output import end_events

    output, got = _output_and_subscriber(ros, "oxygen_test_text_output")

    before = time.monotonic()
    output.publish([token(1, 0, 10, "a"), token(2, 0, 11, "b")], 1_000_000_000)
    after = time.monotonic()
    time.sleep(0.5)
    # two tokens, and three ends that carry none: a request cancelled after its last token,
    # two refused questions
    second = [token(1, 1, 12, "c"), token(2, 1, 13, "d"), token(1, 2, -1, "", True, "cancelled")]
    output.publish(second + end_events(["ask/1", "ask/2"], "rejected"), 2_000_000_000)
    now = time.monotonic()
    assert until(lambda: len(got) == 7), "every event is published, the ends included"
    assert sum(m.token_id >= 0 for m in got) == 4

    assert output.rate.total == 4, "7 events published, 4 of them tokens"
    # a fresh meter reads the events after its first add over the time since: the 2 tokens of
    # the second batch (5 with the ends counted) over (now - first add)
    rate = output.rate.rate(now)
    assert 2 / (now - before) <= rate <= 2 / (now - after)


def test_a_request_names_its_observation_however_long_it_decodes(ros):
    """A request keeps naming the observation it reads after that frame has left the window of
    frames kept (a long answer, or one decoded slowly); a request that starts from a frame no
    longer kept names none (seq 0), and a refused question names none."""
    from oxygen_ros.ros.text_output import OBSERVATIONS_KEPT, end_events

    output, got = _output_and_subscriber(ros, "oxygen_test_text_observed")
    output.observed(1, 7, 5_000_000_000)  # frame 1 took observation 7
    output.publish([token(5, 0, 10, "a")], 1)
    for frame in range(2, OBSERVATIONS_KEPT + 3):  # frame 1 leaves the window
        output.observed(frame, frame + 6, frame * 1_000_000_000)
    output.publish([token(5, 1, 11, "b"), token(6, 0, 12, "c"), token(5, 2, -1, "", True, "eos")], 2)
    output.publish(end_events(["q"], "rejected"), 3)
    assert until(lambda: len(got) == 5)
    assert [(m.request_id, m.observation_seq, m.observation_stamp.sec) for m in got] == [
        (5, 7, 5), (5, 7, 5), (6, 0, 0), (5, 7, 5), (0, 0, 0)]
