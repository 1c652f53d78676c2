"""The package as installed by `make venv` / colcon: the Python package (version, the
source checkout importing the installed messages, the installed copy on its own) and the
installed prefix (executables, launcher interpreter, ament index, share/).

rclpy is imported inside the tests only, so collecting this file never starts ROS.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ros_harness import REPO, executables, installed_prefix

PACKAGE = "oxygen_ros"


def _package_xml_version():
    text = (REPO / "package.xml").read_text()
    return re.search(r"<version>\s*([^<\s]+)\s*</version>", text).group(1)


# --------------------------------------------------------------------------
# the Python package
# --------------------------------------------------------------------------


def _python(code: str, cwd) -> str:
    """Run ``code`` in a fresh interpreter (this venv's) from ``cwd``; its stdout."""
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_version_matches_package_xml():
    import oxygen_ros

    assert oxygen_ros.__version__ == _package_xml_version()
    assert oxygen_ros.__doc__ and oxygen_ros.__doc__.strip()


def test_import_from_source_checkout_finds_installed_messages():
    # Run from the repository root, as the tests do: oxygen_ros comes from
    # the source tree, oxygen_ros.msg from the installed copy, and neither
    # oxygen_ros nor oxygen_ros.core imports rclpy.
    code = (
        "import importlib.util, json, sys\n"
        "import oxygen_ros\n"
        "core = importlib.util.find_spec('oxygen_ros.core') is not None\n"
        "if core:\n"
        "    import oxygen_ros.core\n"
        "light = 'rclpy' not in sys.modules\n"
        "import oxygen_ros.msg\n"
        "print(json.dumps({'pkg': oxygen_ros.__file__, 'msg': oxygen_ros.msg.__file__,\n"
        "                  'core': core, 'light': light}))\n"
    )
    stdout = _python(code, REPO)
    import json

    info = json.loads(stdout.strip().splitlines()[-1])
    assert Path(info["pkg"]).resolve() == REPO / PACKAGE / "__init__.py"
    assert REPO / PACKAGE not in Path(info["msg"]).resolve().parents
    assert info["light"], "importing oxygen_ros / oxygen_ros.core imported rclpy"


def test_installed_copy_imports_on_its_own(tmp_path):
    # From elsewhere (no source checkout on sys.path) the installed package
    # is complete: sources merged with the generated messages.
    code = (
        "import oxygen_ros, oxygen_ros.msg\n"
        "print(oxygen_ros.__file__)\n"
        "print(oxygen_ros.__version__)\n"
    )
    stdout = _python(code, tmp_path)
    path, version = stdout.split()[-2:]
    assert REPO / PACKAGE not in Path(path).resolve().parents
    assert version == _package_xml_version()


# --------------------------------------------------------------------------
# the installed prefix
# --------------------------------------------------------------------------


def test_executables_list():
    rows = executables()
    names = {name for name, *_ in rows}
    assert {"camera_node", "inference_node", "synthetic_camera", "bag_player"} <= names
    assert {
        "oxygen-agent", "oxygen-bench", "oxygen-calibrate",
        "oxygen-train", "oxygen-eval", "oxygen-soak", "oxygen-ask",
    } <= names
    assert len(names) == len(rows)


@pytest.mark.parametrize("name,where,module,function", executables())
def test_executable_installed(name, where, module, function):
    prefix = installed_prefix()
    path = prefix / ("lib/oxygen_ros" if where == "lib" else "bin") / name
    assert path.is_file(), path
    assert os.access(path, os.X_OK), f"{path} is not executable"
    text = path.read_text()
    shebang = text.splitlines()[0]
    assert shebang.startswith("#!")
    interpreter = shebang[2:].strip()
    assert os.access(interpreter, os.X_OK), f"{path}: interpreter {interpreter} missing"
    assert f"        from {module} import {function}\n        _code = {function}()\n" in text
    assert f"_prefix = '{prefix}'" in text


def test_launcher_interpreter_sees_installed_package(tmp_path):
    prefix = installed_prefix()
    name, where = executables()[0][:2]
    path = prefix / ("lib/oxygen_ros" if where == "lib" else "bin") / name
    interpreter = path.read_text().splitlines()[0][2:].strip()
    out = subprocess.run(
        [interpreter, "-c", "import oxygen_ros.msg; print(oxygen_ros.msg.ActionChunk.__name__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "ActionChunk"


def test_ament_index_and_share():
    prefix = installed_prefix()
    assert (prefix / "share/ament_index/resource_index/packages/oxygen_ros").is_file()
    assert (prefix / "share/oxygen_ros/package.xml").is_file()
    assert (prefix / "share/oxygen_ros/package.xml").read_text() == (REPO / "package.xml").read_text()
    messages = sorted(p.name for p in (REPO / "msg").glob("*.msg"))
    assert messages == ["ActionChunk.msg", "Observation.msg", "Question.msg", "TextToken.msg"]
    for name in messages:
        assert (prefix / "share/oxygen_ros/msg" / name).is_file()
    for folder in ("launch", "config"):
        if (REPO / folder).is_dir() and any((REPO / folder).iterdir()):
            assert (prefix / "share/oxygen_ros" / folder).is_dir()


def test_installed_python_sources_match_checkout():
    # The installed copy holds the sources merged with the generated code.
    prefix = installed_prefix()
    import oxygen_ros.msg

    installed = Path(oxygen_ros.msg.__file__).resolve().parents[1]
    assert prefix in installed.parents
    assert (installed / "__init__.py").read_text() == (REPO / PACKAGE / "__init__.py").read_text()
    assert (installed / "msg" / "_action_chunk.py").is_file()
    if (REPO / PACKAGE / "data").is_dir():
        assert (installed / "data").is_dir()


def test_ament_index_lookup(monkeypatch):
    from ament_index_python.packages import (
        get_package_prefix,
        get_package_share_directory,
    )

    prefix = installed_prefix()
    monkeypatch.setenv("AMENT_PREFIX_PATH", str(prefix))
    assert Path(get_package_prefix(PACKAGE)) == prefix
    assert Path(get_package_share_directory(PACKAGE)) == prefix / "share" / PACKAGE


def test_a_camera_side_does_not_import_the_model_loader():
    """A robot's camera-side process (camera node, synthetic camera) does not import
    transformers: the camera node names the inference node's parameters, whose sizes check
    lives with the checkpoint loader, and importing that loader took 4 s of its start on 2
    cores, long enough for the inference node to warn 'is the camera node running?'."""
    import subprocess
    import sys

    code = ("import sys, oxygen_ros.ros.camera_node, oxygen_ros.ros.synthetic_camera, oxygen_ros.ros.robot_process\n"
            "print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"
