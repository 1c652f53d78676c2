"""The inference node's start-up lines name topics as they resolve, after remapping and the
namespace, as the graph shows them: the embedded model's warning that its JointTrajectory must
not drive a real arm, and the note that joint_names covers fewer dimensions than the actions,
named the parameter's topic (``-r /oxygen/joint_trajectory:=/robot1/traj`` still read
``/oxygen/joint_trajectory``)."""

from ros_harness import inference_topics, params, unique_prefix, until


def _node(ros, prefix: str, remaps=(), **overrides):
    """An inference node in namespace ``prefix`` on :func:`inference_topics` (``overrides`` override),
    with ``remaps`` (``from:=to`` rules)."""
    from oxygen_ros.ros.inference_node import InferenceNode

    values = {**inference_topics(prefix), "preset": "tiny", "model_path": "", **overrides}
    cli = ["--ros-args", *(arg for rule in remaps for arg in ("-r", rule))]
    return ros.add(InferenceNode(context=ros.context, namespace=prefix, parameter_overrides=params(**values),
                                 cli_args=cli))


def _line(err: str, text: str) -> str:
    lines = [line for line in err.splitlines() if text in line]
    assert len(lines) == 1, (text, err)
    return lines[0]


def test_the_demo_models_trajectory_warning_names_the_remapped_topic(ros, capfd):
    prefix = unique_prefix()
    node = _node(ros, prefix, [f"{prefix}/trajectory:={prefix}/robot1/traj"], joint_names=["gripper_x", "gripper_y"])
    line = _line(capfd.readouterr().err, "must not drive a real arm's controller")
    assert f"its JointTrajectory on {prefix}/robot1/traj must not drive" in line, line
    assert f"{prefix}/trajectory " not in line
    # what the graph shows (the publisher is the control process's)
    assert until(lambda: node.count_publishers(f"{prefix}/robot1/traj") == 1)


def test_the_joint_names_note_names_the_resolved_topics_of_each_robot(ros, capfd, random_tiny_dir):
    """Relative topics resolve in the node's namespace, each robot's under its name; the
    ActionChunk topic remapped too."""
    prefix = unique_prefix()
    _node(ros, prefix, [f"{prefix}/b/act:={prefix}/b/remapped_actions"], model_path=random_tiny_dir,
          joint_names=["j0"], trajectory_topic="traj", actions_topic="act", robots=["a", "b"])
    line = _line(capfd.readouterr().err, "joint_names names 1 joints and the actions have 32 dimensions")
    assert (f"{prefix}/a/traj, {prefix}/b/traj carry the first 1 of each action, "
            f"{prefix}/a/act, {prefix}/b/remapped_actions all 32") in line, line
