"""ROS-free core of oxygen_ros: model, tokenizer and synthetic task."""
