"""Launch the oxygen_ros agent: camera node + inference node (+ synthetic camera with demo:=true).

    ros2 launch oxygen_ros agent.launch.py [params_file:=...] [model_path:=...] [model_sizes:=k=v,...] [preset:=...]
        [device:=cpu|cuda] [dtype:=float32|bfloat16] [setting:=...] [control_rate_hz:=...]
        [steps_per_frame:=...] [camera_topic:=/my/camera/image_raw] [demo:=true] [robots:=left,right]
        [compile:=auto|on|off] [autostart:=true|false]
        [respawn:=true [respawn_delay:=1.0] [respawn_max_retries:=N]]

Every node reads its section of ``params_file`` (default: the installed
``config/agent.yaml``); an argument left empty keeps the file's value, a
given one overrides it (``parameters=[params_file, overrides]``, the
overrides in a file of their own, see below). A ``params_file`` that is missing or not readable YAML is an error: nothing starts.
``camera_topic`` remaps ``/camera/image_raw`` of the camera node and of the
synthetic camera. ``demo`` is false by default: a robot must never act on a
synthetic camera by accident.

``robots:=left,right`` starts, per robot, the camera node (and with
``demo:=true`` the synthetic camera) in the robot's namespace, on its
``/<robot>/...`` topics, and one inference node serving them all; each
robot-side node gets its parameters as explicit overrides, merged by the plan
from the file's generic section and the robot's own (``left/oxygen_camera:``),
see ``oxygen_ros.ros.robot_plan``.

A node's overrides go to it as a parameters file of its own, written by
``overrides_file`` into a temporary folder, after ``params_file``: launch_ros
refuses an empty list in a parameter dict, and a robot's merged parameters
hold some (``compressed_image_topics: []``). The folder is removed when the
launch shuts down; one left by a launch that ended without shutting down
(SIGTERM, SIGKILL) is removed by the next launch
(``oxygen_ros.ros.launch_folder``).

Every node is required: when one exits (a bad parameter, a model that does not
load, a crash), the launch logs which one and how, stops the others and exits
with a non-zero status (an exception in an OnProcessExit handler is what makes
``ros2 launch`` return 1). Ctrl-C ends it as usual. With ``respawn:=true`` a
camera side's node (camera node, synthetic camera) that exits is restarted by
launch_ros after ``respawn_delay`` seconds instead (logged), unless it exited
for a bad parameter (code 2) or was restarted ``respawn_max_retries`` times
already (empty: no limit); the inference node stays required.

The nodes and arguments are defined once, in ``oxygen_ros.ros.plan_tables``
(``NODES``, ``ARGUMENTS``) and ``oxygen_ros.ros.plan`` (``node_plan``), which ``oxygen-agent`` uses too, so
both start the same thing.
"""

import os
import shutil
from functools import partial

from ament_index_python.packages import get_package_share_directory
import launch.logging
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, LogInfo, OpaqueFunction, RegisterEventHandler
from launch.event_handlers import OnProcessExit, OnShutdown
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from oxygen_ros.ros.launch_folder import new_overrides_folder
from oxygen_ros.ros.plan import (
    misspelt_arguments, node_exit_message, node_label, overrides_file, plan_warnings, resolve, respawn_message,
)
from oxygen_ros.ros.plan_tables import ARGUMENTS, PACKAGE


def _default_params_file():
    return os.path.join(get_package_share_directory(PACKAGE), 'config', 'agent.yaml')


class NodeExited(RuntimeError):
    """A required node exited: raised from its OnProcessExit handler to end the launch non-zero."""


def _on_exit(name, respawn_delay, max_retries, restarted, event, context):
    """``restarted``: [the node's restarts so far], counted as launch_ros counts them (it restarts
    a node while its restarts are fewer than respawn_max_retries)."""
    message = node_exit_message(name, event.returncode, context.is_shutdown, respawn_delay, restarted[0],
                                max_retries)
    if message is not None:
        raise NodeExited(message)
    if respawn_delay is not None and not context.is_shutdown:  # launch_ros restarts it
        restarted[0] += 1
        return [LogInfo(msg=respawn_message(name, event.returncode, respawn_delay, restarted[0], max_retries))]
    return None


def _remove(directory, event, context):
    shutil.rmtree(directory, ignore_errors=True)


def _nodes(context, *args, **kwargs):
    values = {a.name: LaunchConfiguration(a.name).perform(context) for a in ARGUMENTS}
    plan, params_file = resolve(values)  # ValueError: missing params_file, bad argument
    overrides_dir, left_behind = new_overrides_folder()
    # the nodes read their files as they start; the folder goes when the launch ends
    actions = [RegisterEventHandler(OnShutdown(on_shutdown=partial(_remove, overrides_dir)))]
    if left_behind:
        actions.append(LogInfo(msg=f'removed {len(left_behind)} overrides folder(s) of launches that ended '
                                   f'without shutting down (SIGTERM or SIGKILL): {", ".join(left_behind)}'))
    log = launch.logging.get_logger('launch.user')  # where LogInfo's lines go, at the warning level
    for line in misspelt_arguments(context.launch_configurations) + plan_warnings(plan, params_file):
        log.warning(line)
    for item in plan:
        spec, label = item['spec'], node_label(item)
        parameters = [params_file]
        if item['parameters']:
            parameters.append(overrides_file(item, overrides_dir))
        node = Node(
            package=PACKAGE,
            executable=spec.executable,
            name=spec.name,
            namespace=item['namespace'] or None,
            output='screen',
            emulate_tty=True,
            parameters=parameters,
            remappings=item['remappings'],
            respawn=item['respawn_delay'] is not None,
            respawn_delay=item['respawn_delay'],
            respawn_max_retries=-1 if item['respawn_max_retries'] is None else item['respawn_max_retries'],
        )
        actions.append(node)
        on_exit = partial(_on_exit, label, item['respawn_delay'], item['respawn_max_retries'], [0])
        actions.append(RegisterEventHandler(OnProcessExit(target_action=node, on_exit=on_exit)))
    return actions


def generate_launch_description():
    arguments = []
    for a in ARGUMENTS:
        default = _default_params_file() if a.name == 'params_file' else a.default
        arguments.append(DeclareLaunchArgument(a.name, default_value=default, description=a.description))
    return LaunchDescription(arguments + [OpaqueFunction(function=_nodes)])
