"""One inference node serving several robots (``robots`` parameter), on real DDS.

Each robot has its own topics under ``/<robot>``: its chunks, text, answers and
diagnostics are its own, frames serve every robot's newest observation together,
and a robot whose camera stops underruns on its own clock only.
"""

import functools

import pytest
import ros_harness
from robot_harness import RobotClient, robots_node
from ros_harness import check_chunks, check_text, params, reliable, unique_prefix

until = functools.partial(ros_harness.until, timeout=30.0)

ROBOTS = ("left", "right")


@pytest.fixture
def served(ros):
    """(node, {robot: RobotClient}, diagnostics) with a node serving ``left`` and ``right``."""
    from diagnostic_msgs.msg import DiagnosticArray

    prefix = unique_prefix()
    node = robots_node(ros, prefix, ROBOTS)
    client = ros.node("oxygen_test_robots")
    robots = {r: RobotClient(client, prefix, r) for r in ROBOTS}
    statuses = []
    client.create_subscription(DiagnosticArray, "/diagnostics", lambda m: statuses.extend(m.status), reliable(50))
    for c in robots.values():
        c.wait_discovered(node)
    return node, robots, statuses


def _observe_all(robots, n: int, period: float = 0.05, who=ROBOTS):
    import time

    for _ in range(n):
        for r in who:
            robots[r].observe()
        time.sleep(period)


def test_each_robot_gets_its_own_chunks_and_text_from_shared_frames(served):
    node, robots, statuses = served
    assert node.robot_names == ROBOTS
    _observe_all(robots, 20)
    assert until(lambda: all(len(c.chunks) >= 10 and any(m.done for m in c.text) for c in robots.values()))
    for c in robots.values():
        check_chunks(c.chunks, horizon=node.horizon)
        check_text(c.text)
    # one frame served both robots: an engine frame id in both robots' chunks
    frames = [{m.frame_id for m in c.chunks} for c in robots.values()]
    assert frames[0] & frames[1], "no frame prefilled and denoised both robots' observations"
    # a language request reads one robot's observation: its tokens go to that robot alone
    requests = [{m.request_id for m in c.text} for c in robots.values()]
    assert not requests[0] & requests[1]
    assert until(lambda: {node.status_name(f"robot {r}") for r in ROBOTS} <= {s.name for s in statuses})
    for r in ROBOTS:
        d = node.diagnostics(r)
        assert d["robot"] == r and d["frames"] > 0 and 0 < d["frame_share"] <= 1.0
        assert node.tick_counts(r)["published"] > 0


def test_a_question_is_answered_on_its_robots_topic_from_its_observation(served):
    node, robots, _ = served
    robots["left"].observe()
    assert until(lambda: robots["left"].chunks)
    robots["right"].ask("early")  # right has no observation yet: refused, on right's topic
    assert until(lambda: any(m.client_id == "early" and m.done for m in robots["right"].text))
    assert [m.finish_reason for m in robots["right"].text if m.client_id == "early"] == ["rejected"]
    robots["left"].ask("q-left")
    assert until(lambda: any(m.client_id == "q-left" and m.done for m in robots["left"].text))
    assert {m.finish_reason for m in robots["left"].text if m.client_id == "q-left" and m.done} <= {"eos", "length"}
    assert not any(m.client_id == "q-left" for m in robots["right"].text)
    assert not any(m.client_id == "early" for m in robots["left"].text)


def test_text_names_the_observation_it_reads_as_that_frames_chunks_do(served):
    """A TextToken's observation_seq and observation_stamp are those of the observation its
    request reads (its robot's, in the frame frame_id names): the same as the ActionChunks of
    that frame give, for periodic descriptions and for a question (its robot's newest
    observation when asked), so a consumer of the text alone knows which image it is about."""
    node, robots, _ = served
    _observe_all(robots, 10)
    robots["left"].ask("q-which")
    _observe_all(robots, 10)

    def stamp(t):
        return t.sec * 10**9 + t.nanosec

    def chunks(c) -> dict:
        """{frame_id: (seq, stamp)} of the robot's chunks received (a chunk replaced before any tick
        published it, on a loaded machine, is not among them)."""
        return {m.frame_id: (m.observation_seq, stamp(m.observation_stamp)) for m in c.chunks}

    def described(c) -> bool:  # a finished description whose frame's chunk came
        return any(m.done and m.request_id and not m.client_id and m.frame_id in chunks(c) for m in c.text)

    assert until(lambda: any(m.client_id == "q-which" and m.done for m in robots["left"].text)
                 and all(described(c) for c in robots.values()))
    for c in robots.values():
        seen = chunks(c)
        for m in (m for m in c.text if m.request_id):
            named = (m.observation_seq, stamp(m.observation_stamp))
            assert seen.get(m.frame_id, named) == named, (m.frame_id, named, seen.get(m.frame_id))
            assert 0 <= m.observation_seq < 20 and named[1] > 0, named  # one of the 20 observations sent
    # each robot's text names its own observations: the two robots' stamps never the same
    left, right = ({stamp(m.observation_stamp) for m in robots[r].text if m.request_id} for r in ROBOTS)
    assert not left & right
    asked = [m for m in robots["left"].text if m.client_id == "q-which"]
    assert asked[0].observation_seq >= 9  # the newest when the frame took it: not older than when asked


def test_a_robot_whose_camera_stops_underruns_on_its_own_clock_only(served):
    node, robots, _ = served
    _observe_all(robots, 10)
    assert until(lambda: all(node.tick_counts(r)["published"] > 0 for r in ROBOTS))
    before = {r: node.tick_counts(r)["underruns"] for r in ROBOTS}
    _observe_all(robots, 40, who=("left",))  # 2 s: right's camera has stopped
    after = {r: node.tick_counts(r)["underruns"] for r in ROBOTS}
    assert after["right"] - before["right"] >= 20, (before, after)
    assert after["left"] - before["left"] <= 10, (before, after)  # a frame late now and then on a loaded machine


def test_the_node_status_sums_the_robots_underruns_and_shows_the_oldest_observation(served):
    """The node's own status (``oxygen_inference: engine``) is the whole node's: its underruns are
    every robot's together, and its observation age is the oldest robot's, so a robot whose camera
    stopped shows there even while the other robot's camera runs."""
    node, robots, _ = served
    _observe_all(robots, 10)
    assert until(lambda: all(node.tick_counts(r)["published"] > 0 for r in ROBOTS))
    _observe_all(robots, 20, who=())  # 1 s: both cameras stop, both robots underrun
    _observe_all(robots, 40, who=("left",))  # 2 s more: right's camera stays stopped
    first = {r: node.diagnostics(r) for r in ROBOTS}
    whole = node.diagnostics()
    last = {r: node.diagnostics(r) for r in ROBOTS}  # ticks go on between the reads: bounds, not equality
    before, after = ({r: d[r]["underruns"] for r in ROBOTS} for d in (first, last))
    assert before["left"] >= 10 and before["right"] >= 40, before
    assert sum(before.values()) <= whole["underruns"] <= sum(after.values()), (before, whole["underruns"], after)
    assert first["right"]["observation_age_ms"] > 1500 > first["left"]["observation_age_ms"]
    assert first["right"]["observation_age_ms"] <= whole["observation_age_ms"] <= last["right"]["observation_age_ms"]
    # and the status names whose camera it is
    assert whole["observation_age_robot"] == "right"
    _, message = node.diagnostic_status(whole)
    assert "no fresh observation from robot right for" in message, message


def test_after_a_deactivate_a_robot_s_action_frequency_counts_from_the_activate(served):
    """The seconds a node was inactive are no part of a robot's action frequency after the next
    activate: with them in its 5 s window, a robot publishing at full rate read 60-90% of it
    (WARN 'below the control rate') for 5 s after every activate."""
    import time

    node, robots, _ = served
    _observe_all(robots, 40)  # 2 s at 20 observations a second
    assert until(lambda: all(node.tick_counts(r)["published"] > 0 for r in ROBOTS))
    node.deactivate()
    time.sleep(2.0)
    node.activate()
    _observe_all(robots, 30)  # 1.5 s: of a 5 s window, 1.5 s before the deactivate and 2 s inactive
    rates = {r: node.diagnostics(r)["chunks_per_s"] for r in ROBOTS}
    assert all(rate >= 15.0 for rate in rates.values()), rates  # 20 a second: every observation gets a frame


def test_bad_robot_names_are_refused_naming_them(ros):
    from oxygen_ros.ros.inference_node import InferenceNode
    from oxygen_ros.ros.parameters import ParameterError

    for robots, what in ((["left", "left"], "listed twice"), (["2nd"], "'2nd'"), (["a/b"], "'a/b'")):
        with pytest.raises(ParameterError, match="robots") as info:
            InferenceNode(context=ros.context, parameter_overrides=params(robots=robots, model_path=""))
        assert what in str(info.value)


def test_questions_and_goals_sent_to_the_one_robot_names_are_named_in_the_status(served, ros, capfd):
    """Serving several robots, the node takes nothing on the one-robot topics (a question script
    kept from a one-robot set-up publishing on the bare question topic gets no answer, and ROS
    says nothing of a topic without subscribers): its status and its console name who sends
    there and where that robot's inputs are (once for the node, not once per robot), and say
    nothing once they are gone."""
    from diagnostic_msgs.msg import DiagnosticStatus
    from rclpy.action import ActionClient

    from oxygen_ros.action import Ask
    from oxygen_ros.msg import Question

    node, robots, _ = served
    _observe_all(robots, 4)
    assert node.diagnostics()["unserved_inputs"] == ""
    asker = ros.node("one_robot_asker")
    bare = node.params["question_topic"]  # <prefix>/question, as each robot's without /<robot>
    publisher = asker.create_publisher(Question, bare, reliable(10))
    client = ActionClient(asker, Ask, node.params["ask_action"])
    who = asker.get_fully_qualified_name()
    assert until(lambda: f"questions on {bare} from {who} (robot left's go to /left{bare})"
                 in node.diagnostics()["unserved_inputs"])
    ask = node.params["ask_action"]
    assert until(lambda: f"Ask goals on {ask} from {who} (robot left's go to /left{ask})"
                 in node.diagnostics()["unserved_inputs"])
    d = node.diagnostics()
    level, message = node.diagnostic_status(d)
    assert level == DiagnosticStatus.WARN and "no robot takes these inputs" in message, (level, message)
    assert "the node takes each robot's under its name: send there" in message, message
    for r in ROBOTS:  # a robot's own status is its own inputs'
        assert "unserved_inputs" not in node.diagnostics(r)
    logged = []
    assert until(lambda: logged.append(capfd.readouterr().err) or "no robot takes these inputs" in "".join(logged))
    lines = [line for line in "".join(logged).splitlines() if "no robot takes these inputs" in line]
    assert lines and all("[WARN]" in line and "robot left:" not in line and "robot right:" not in line
                         for line in lines), lines
    # something else takes the bare questions (a node serving one robot on this network): not named
    taker = ros.node("one_robot_taker").create_subscription(Question, bare, lambda m: None, reliable(10))
    assert until(lambda: "questions on" not in node.diagnostics()["unserved_inputs"]
                 and "Ask goals on" in node.diagnostics()["unserved_inputs"])
    taker.destroy()
    client.destroy()
    asker.destroy_publisher(publisher)
    assert until(lambda: node.diagnostics()["unserved_inputs"] == "")


def test_one_named_robot_is_warned_of_questions_on_the_bare_topic_too(ros):
    """``robots: [left]``, the first step from one robot to several, takes its inputs under
    /left as well: a question script left on the bare topic is named."""
    from oxygen_ros.msg import Question

    prefix = unique_prefix()
    node = robots_node(ros, prefix, ["left"])
    asker = ros.node("one_robot_asker")
    asker.create_publisher(Question, node.params["question_topic"], reliable(10))
    assert until(lambda: f"from {asker.get_fully_qualified_name()} (robot left's go to /left{prefix}/question)"
                 in node.diagnostics()["unserved_inputs"])
    level, message = node.diagnostic_status()
    assert "no robot takes these inputs: questions on" in message, message
