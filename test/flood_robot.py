"""A misbehaving robot, run as its own process by test_robots_isolation.py: until killed it
publishes malformed Observations (image rows shorter than the width) at 20 Hz and
questions at 100 per second on ``<base>/observation`` and ``<base>/question``.

    python flood_robot.py <base topic> <domain id>
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(base: str, domain: int) -> None:
    import rclpy
    from message_builders import observation_msg
    from ros_harness import reliable

    from oxygen_ros.msg import Observation, Question

    rclpy.init(domain_id=domain)
    node = rclpy.create_node("oxygen_test_flood")
    obs = node.create_publisher(Observation, f"{base}/observation", reliable(10))
    questions = node.create_publisher(Question, f"{base}/question", reliable(1000))
    print("flooding", flush=True)
    seq = 0
    while True:
        msg = observation_msg(seq, node.get_clock().now().nanoseconds)
        msg.images[0].step = 5
        obs.publish(msg)
        for i in range(5):
            questions.publish(Question(client_id=f"flood-{seq}-{i}", text="what do you see? " * 20))
        seq += 1
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
