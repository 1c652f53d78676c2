"""ROS 2 side of oxygen_ros: thin nodes around the ROS-free core.

The modules here only convert messages, hold parameters and drive timers;
everything that decides something lives in :mod:`oxygen_ros.core`.

* :mod:`.conversions` - a package, one module per concept: stamps, image
  checks (:class:`~.conversions.ImageError`), ``sensor_msgs/Image`` /
  ``CompressedImage`` <-> numpy RGB, the ``Observation`` message <->
  :class:`oxygen_ros.core.observation.Observation`, and the ``ActionChunk``,
  ``TextToken`` and ``JointTrajectory`` outputs.
* :mod:`.parameters` - the one parameter system (specs with their checks);
  :mod:`.qos` - the shared QoS profiles.
* :mod:`.camera_node` - groups the newest frame of every camera (plus the
  instruction and the joint state) into ``Observation`` messages.
* :mod:`.inference_node` - subscriptions, the control tick
  (:mod:`.action_output`), the worker running the core's frame loop
  (:mod:`.frame_worker`), text and diagnostics out.
* :mod:`.synthetic_camera` - a synthetic closed-loop camera; :mod:`.bag_player` - a rosbag2 player.
* :mod:`.bags` - write and read rosbag2 directories (MCAP or SQLite3).
* :mod:`.plan_tables`, :mod:`.plan`, :mod:`.robot_plan` - the agent's node plan (shared
  with ``launch/agent.launch.py``); :mod:`.agent` - the one start-up of ``oxygen-agent``
  and ``oxygen-soak``, spinning (and :mod:`.robot_process`: robots' camera sides).
* :mod:`.process` - the process set-up of every entry point that runs the
  control loop.

Importing this package imports nothing heavy; the submodules import rclpy.
"""
