"""The shipped default model end to end on ROS: a rosbag of a red-circle scene.

The test renders one scene of the synthetic task (target: the red circle, a
blue square beside it) into a rosbag2 of camera images, joint states (the
gripper position) and the latched instruction, replays it in lockstep through
camera node -> inference node running the embedded default model, and checks
what a user would look for: the streamed text names the red circle, and the
actions point the gripper at it. The image reaches both outputs only through
the prefill's shared KV cache, so this is the whole pipeline on real DDS. Then
it asks the running node a question of every kind on ``/oxygen/question``, and
one through the Ask action with ``oxygen-ask`` as a user types it, and checks
the answers.
"""

import subprocess

import numpy as np
import pytest
from ros_harness import (Ros, check_text, installed_script, params, play_once_matched, player_progress, reliable,
                         unique_prefix, until)

from oxygen_ros.core.sim import scene as sim

FRAMES = 4
CAMERA_PIXELS = 96  # the camera node resizes to the model's 48
#: Questions of every kind (oxygen_ros.core.sim.questions) and their answers for :func:`_scene`.
QUESTIONS = {"what is the target?": "red circle", "where is the target?": "right of gripper",
             "how many red objects are there?": "one", "how many blue objects do you see?": "one",
             "how many green objects are there?": "zero",
             "is the gripper at the target?": "no"}
ASKED = ("where is the red circle?", "right of gripper")  # through the Ask action, with oxygen-ask


def _scene():
    objects = (sim.SceneObject("blue", "square", (-0.45, 0.4)), sim.SceneObject("red", "circle", (0.4, -0.35)))
    return sim.Scene(objects, target_index=1, gripper=(-0.3, -0.2))


def _write_bag(path, prefix, scene):
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Header, String

    from oxygen_ros.ros.bags import write_bag
    from oxygen_ros.ros.conversions import ns_to_time_msg, rgb_to_image_msg
    from oxygen_ros.ros.synthetic_camera import JOINT_NAMES

    image = sim.render(scene, CAMERA_PIXELS)
    t0 = 1_700_000_000 * 10**9
    messages = [(f"{prefix}/instruction", String(data=scene.instruction), t0)]
    for i in range(FRAMES):
        stamp = t0 + (i + 1) * 100_000_000
        state = JointState(header=Header(stamp=ns_to_time_msg(stamp), frame_id="table"), name=list(JOINT_NAMES),
                           position=[float(v) for v in scene.gripper])
        messages.append((f"{prefix}/joint_states", state, stamp - 50_000_000))  # well before its image: topics are not ordered
        messages.append((f"{prefix}/camera/image_raw", rgb_to_image_msg(image, "rgb8", stamp * 1e-9, "cam"), stamp))
    return write_bag(path, "mcap", messages, latched_topics=[f"{prefix}/instruction"])


@pytest.fixture(scope="module")
def replay(module_ros_env, tmp_path_factory):
    """(scene, chunks, text tokens, answers) of the default agent on the red-circle bag; answers:
    {question: answer} of QUESTIONS on the question topic and of ASKED through oxygen-ask."""
    from oxygen_ros.msg import ActionChunk, Question, TextToken

    from oxygen_ros.ros.camera_node import CameraNode
    from oxygen_ros.ros.inference_node import InferenceNode
    from oxygen_ros.ros.bag_player import BagPlayer

    prefix = unique_prefix()
    scene = _scene()
    bag = _write_bag(tmp_path_factory.mktemp("bag") / "red_circle", prefix, scene)
    topics = dict(observation_topic=f"{prefix}/observation", actions_topic=f"{prefix}/actions",
                  text_topic=f"{prefix}/text")
    chunks, text = [], []
    with Ros() as ros:
        client = ros.node("oxygen_test_recorder")
        client.create_subscription(ActionChunk, topics["actions_topic"], chunks.append, reliable(1000))
        client.create_subscription(TextToken, topics["text_topic"], text.append, reliable(5000))
        inference = ros.add(InferenceNode(context=ros.context, namespace=prefix, parameter_overrides=params(
            model_path="",  # the embedded default model
            chunk_origin="frame_end", max_observation_age=0.0, question_topic=f"{prefix}/question",
            ask_action=f"{prefix}/ask", trajectory_topic=f"{prefix}/trajectory", **topics)))
        camera = ros.add(CameraNode(context=ros.context, namespace=prefix, parameter_overrides=params(
            image_topics=[f"{prefix}/camera/image_raw"], instruction_topic=f"{prefix}/instruction",
            state_topic=f"{prefix}/joint_states", observation_topic=topics["observation_topic"],
            image_size=48, max_age=10.0)))
        player = ros.add(BagPlayer(context=ros.context, namespace=prefix, parameter_overrides=params(
            bag_path=str(bag), lockstep=True, rate=4.0, action_topic=topics["actions_topic"],
            start_delay_s=60.0)))
        play_once_matched(ros, player, inference)
        assert ros.wait_until(player.done.done, 60.0), player_progress(ros, player)
        assert player.lockstep_timeouts == 0, \
            f"lockstep broke: an ActionChunk did not come ({camera.published} observations published)"

        def answered():
            ends = [m for m in text if m.done]
            return len(ends) >= FRAMES and all(m.finish_reason in ("eos", "length") for m in ends)
        assert ros.wait_until(answered, 30.0), f"not every frame's description finished: {text[-3:]}"
        descriptions = list(text)
        answers = _ask(client, f"{prefix}/question", text, Question)
        asked = subprocess.run([installed_script("oxygen-ask"), "--action", f"{prefix}/ask", ASKED[0]],
                               capture_output=True, text=True, timeout=60)
        assert asked.returncode == 0, asked.stderr
        answers[ASKED[0]] = asked.stdout.strip()
    return scene, list(chunks), descriptions, answers


def _ask(client, topic, text, Question) -> dict[str, str]:
    """Each question of QUESTIONS on ``topic`` (the node answers from the bag's last frame)."""
    publisher = client.create_publisher(Question, topic, reliable(100))
    assert until(lambda: publisher.get_subscription_count() >= 1), "the inference node does not take questions"
    for i, question in enumerate(QUESTIONS):
        publisher.publish(Question(client_id=f"q{i}", text=question))

    def ends():
        return {m.client_id for m in text if m.done and m.client_id.startswith("q")}
    assert until(lambda: len(ends()) == len(QUESTIONS), 30.0), f"questions unanswered: {ends()}"
    requests = check_text([m for m in text if m.client_id.startswith("q")])
    by_client = {ms[0].client_id: "".join(m.piece for m in ms) for ms in requests.values()}
    return {question: by_client[f"q{i}"].strip() for i, question in enumerate(QUESTIONS)}


def test_text_of_a_red_circle_bag_names_the_red_circle(replay):
    _, _, text, _ = replay
    requests = check_text(text)
    assert len(requests) >= FRAMES
    for tokens in requests.values():
        words = "".join(m.piece for m in tokens if not m.done or m.token_id >= 0).split()
        assert words[:2] == ["red", "circle"], f"request {tokens[0].request_id} said {' '.join(words)!r}"
        assert "square" not in words, "the description names the distractor"


def test_actions_of_a_red_circle_bag_head_for_the_red_circle(replay):
    scene, chunks, _, _ = replay
    ideal = np.subtract(scene.target.position, scene.gripper)
    firsts = {}
    for m in chunks:  # the first message of each frame: its action due then (offset 0 unless a tick was late)
        firsts.setdefault(m.frame_id, np.asarray(m.actions, np.float64).reshape(-1, m.action_dim)[0, :2])
    assert len(firsts) >= FRAMES, f"every observation must give a chunk, got frames {sorted(firsts)}"
    for frame, a in firsts.items():
        cosine = float(a @ ideal / (np.linalg.norm(a) * np.linalg.norm(ideal)))
        assert cosine >= 0.9, f"frame {frame}: first action {a} points away from the red circle ({cosine:.2f})"


def test_questions_to_the_running_node_get_the_right_answers(replay):
    *_, answers = replay
    want = {**QUESTIONS, ASKED[0]: ASKED[1]}
    assert answers == want
