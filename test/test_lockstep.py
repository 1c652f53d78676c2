"""The bag player's lockstep gate (no ROS): an image waits for the policy's answer only once
a whole group (one image of every camera of the gate) went out since the last release."""

from types import SimpleNamespace

from oxygen_ros.ros.lockstep import LockstepGate


def _send(gate, topic, now=0.0):
    released, _ = gate.open(topic, now, timeout_s=5.0)
    if released:
        gate.sent(topic)
    return released


def test_cameras_at_different_rates_do_not_wait_for_an_observation_not_yet_formed():
    """30 Hz and 10 Hz cameras: the fast one's next images go on until the slow one's frame
    completes the group; then the next image waits for an ActionChunk of a newer observation."""
    gate = LockstepGate("/oxygen/actions", ("/fast", "/slow"))
    assert _send(gate, "/fast") and _send(gate, "/slow")  # group 0 out
    assert not _send(gate, "/fast", 0.1)  # held: the policy has not answered group 0
    gate.on_actions(SimpleNamespace(observation_seq=0))
    assert _send(gate, "/fast", 0.2)
    assert _send(gate, "/fast", 0.23) and _send(gate, "/fast", 0.26)  # no slow frame yet: no group to wait on
    assert _send(gate, "/slow", 0.3)  # the group is complete
    assert not _send(gate, "/fast", 0.33) and gate.timeouts == 0
    assert _send(gate, "/fast", 5.5) and gate.timeouts == 1  # no answer: the timeout lets it out


def test_a_gate_without_its_cameras_named_holds_every_camera_s_second_image():
    gate = LockstepGate("/oxygen/actions")
    assert _send(gate, "/a") and not _send(gate, "/a", 0.1)
    gate.on_actions(SimpleNamespace(observation_seq=3))
    assert _send(gate, "/a", 0.2)


def test_no_image_waits_before_the_first_state_has_gone_out():
    """A bag recorded from a running robot that begins with images whose states came before
    the recording did: a camera node with a state_topic groups none of them, so no chunk would
    answer them. They go on; once the state has gone out, the next image waits as always."""
    gate = LockstepGate("/oxygen/actions", ("/cam",), ("/joint_states",))
    assert _send(gate, "/cam") and _send(gate, "/cam", 0.1) and _send(gate, "/cam", 0.2)
    gate.state_sent("/joint_states")
    assert not _send(gate, "/cam", 0.3), "after the first state, an image waits for the chunk"
    gate.on_actions(SimpleNamespace(observation_seq=0))
    assert _send(gate, "/cam", 0.4) and gate.timeouts == 0


def test_with_two_state_topics_images_wait_once_both_have_gone_out():
    gate = LockstepGate("/oxygen/actions", ("/cam",), ("/arm/joint_states", "/gripper/joint_states"))
    gate.state_sent("/arm/joint_states")
    assert _send(gate, "/cam") and _send(gate, "/cam", 0.1)
    gate.state_sent("/gripper/joint_states")
    assert not _send(gate, "/cam", 0.2)


def test_a_timeout_before_any_answer_says_none_came_yet():
    """The first group's wait timing out said 'no ActionChunk newer than observation -1'."""
    gate = LockstepGate("/oxygen/actions", ("/cam",))
    assert _send(gate, "/cam") and not _send(gate, "/cam", 0.1)
    released, warning = gate.open("/cam", 5.2, timeout_s=5.0)
    assert released and warning.startswith("lockstep: no ActionChunk on /oxygen/actions yet within 5.0 s;"), warning
    gate.sent("/cam")
    gate.hold_since = None  # (as the player does once it plays the held image)
    gate.on_actions(SimpleNamespace(observation_seq=3))
    assert _send(gate, "/cam", 5.3)
    gate.hold_since = None
    assert not _send(gate, "/cam", 5.4)
    _, warning = gate.open("/cam", 10.5, timeout_s=5.0)
    assert "no ActionChunk on /oxygen/actions newer than observation 3 within 5.0 s" in warning, warning
