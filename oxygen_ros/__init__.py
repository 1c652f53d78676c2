"""oxygen_ros: serve a vision-language-action model on a robot through ROS 2."""

# This package can be found in two places: the source checkout (the Python
# code) and the install prefix's site-packages, where the build installs the
# same sources merged with the generated message modules (oxygen_ros.msg and
# its C extensions). Extending __path__ over every `oxygen_ros` directory on
# sys.path lets `import oxygen_ros.msg` work when the source checkout comes
# first on sys.path (tests, development) as well as from the installed copy.
# Keep this file free of heavy imports: importing oxygen_ros must never
# import rclpy (nor torch).
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"  # keep equal to <version> in package.xml
