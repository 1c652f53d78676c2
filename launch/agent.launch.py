"""Launch the oxygen_ros agent: camera node + inference node (+ synthetic camera with demo:=true).

    ros2 launch oxygen_ros agent.launch.py [params_file:=...] [model_path:=...] [preset:=...]
        [device:=cpu|cuda] [dtype:=float32|bfloat16] [setting:=...] [control_rate_hz:=...]
        [steps_per_frame:=...] [camera_topic:=/my/camera/image_raw] [demo:=true]

Every node reads its section of ``params_file`` (default: the installed
``config/agent.yaml``); an argument left empty keeps the file's value, a
given one overrides it (``parameters=[params_file, {overrides}]``).
``camera_topic`` remaps ``/camera/image_raw`` of the camera node and of the
synthetic camera. ``demo`` is false by default: a robot must never act on a
synthetic camera by accident.

The nodes and arguments are defined once, in ``oxygen_ros.ros.agent``
(``NODES``, ``ARGUMENTS``, ``node_plan``), which ``oxygen-agent`` uses too, so
both start the same thing. Works with ROS 2 Humble and newer.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from oxygen_ros.ros.agent import ARGUMENTS, PACKAGE, node_plan


def _default_params_file():
    return os.path.join(get_package_share_directory(PACKAGE), 'config', 'agent.yaml')


def _nodes(context, *args, **kwargs):
    values = {a.name: LaunchConfiguration(a.name).perform(context) for a in ARGUMENTS}
    params_file = values.pop('params_file') or _default_params_file()
    actions = []
    for item in node_plan(values):
        spec = item['spec']
        parameters = [params_file]
        if item['parameters']:
            parameters.append(item['parameters'])
        actions.append(Node(
            package=PACKAGE,
            executable=spec.executable,
            name=spec.name,
            output='screen',
            emulate_tty=True,
            parameters=parameters,
            remappings=item['remappings'],
        ))
    return actions


def generate_launch_description():
    arguments = []
    for a in ARGUMENTS:
        default = _default_params_file() if a.name == 'params_file' else a.default
        arguments.append(DeclareLaunchArgument(a.name, default_value=default, description=a.description))
    return LaunchDescription(arguments + [OpaqueFunction(function=_nodes)])
