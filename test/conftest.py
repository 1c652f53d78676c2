"""Shared fixtures. Plain helpers live in three modules: ros_harness.py (rclpy contexts,
nodes and test clients on real DDS, output checks), message_builders.py (messages to
send, well formed or not) and engine_harness.py (engine runs without ROS).

* ``session_compile_cache`` - (automatic) compiled packages go into the session's temporary folder.
* ``lively_tiny`` / ``random_tiny_dir`` - small models for the engine and node tests.
* ``tok`` - the shipped tokenizer.
* ``ros_env`` - the ROS isolation of ``make test`` (domain id, discovery on this machine,
  private log directory), set when missing.
* ``module_ros_env`` - the same for a module-scoped fixture (one set of nodes for a whole file).
* ``ros`` - a private rclpy context whose nodes spin on threads of their own (:class:`ros_harness.Ros`).
* ``stepped_ros`` - a private rclpy context with one executor the test spins itself
  (:class:`ros_harness.SteppedRos`).
"""

import os

import pytest
import torch
from ros_harness import Ros, SteppedRos, ros_environment

from oxygen_ros.core.model.config import TINY
from oxygen_ros.core.model.vla import build_model
from oxygen_ros.core.tokenizer import Tokenizer


def lively(model):
    """Scale the VLM's projections up so an untrained model's greedy text depends
    on what it sees (at the default initialisation it echoes its last token)."""
    with torch.no_grad():
        for layer in model.language_model.layers:
            for name, p in layer.named_parameters():
                if "proj" in name:
                    p.mul_(3.0)
    return model


@pytest.fixture(scope="session", autouse=True)
def session_compile_cache(tmp_path_factory):
    """Compiled packages the tests build (and those of the nodes and commands they start) go into
    the session's temporary folder, not the user's ``~/.cache/oxygen_ros/compile`` where the
    agent's own live; unless the run names a cache itself (``OXYGEN_COMPILE_CACHE``, as
    ``test/cuda_check.sh`` does, or ``TORCHINDUCTOR_CACHE_DIR``). The compile tests that share
    packages point at the same folder, ``<basetemp>/compile-cache``."""
    with pytest.MonkeyPatch.context() as mp:
        if not os.environ.get("OXYGEN_COMPILE_CACHE") and not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
            mp.setenv("OXYGEN_COMPILE_CACHE", str(tmp_path_factory.getbasetemp() / "compile-cache"))
        yield


@pytest.fixture(scope="session")
def lively_tiny():
    return lively(build_model(TINY, seed=2))


@pytest.fixture(scope="session")
def random_tiny_dir(tmp_path_factory):
    """A native checkpoint of the untrained tiny preset (seed 0): for node tests that
    need long answers (the shipped default model says EOS after a few tokens)."""
    from oxygen_ros.core.checkpoints import save_native
    from oxygen_ros.core.tokenizer import default_tokenizer_path

    out = tmp_path_factory.mktemp("random_tiny")
    save_native(build_model(TINY, seed=0), out, tokenizer_path=default_tokenizer_path())
    return str(out)


@pytest.fixture(scope="session")
def tok():
    return Tokenizer.default()


@pytest.fixture
def ros_env(monkeypatch, tmp_path):
    return ros_environment(monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def module_ros_env(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        yield ros_environment(mp, tmp_path_factory.mktemp("ros"))
    finally:
        mp.undo()


@pytest.fixture
def ros(ros_env):
    """A private, initialised rclpy context; every node added spins on its own executor thread."""
    with Ros() as r:
        yield r


@pytest.fixture
def stepped_ros(ros_env):
    """A private, initialised rclpy context with an executor the test spins; nodes added with ros.add()."""
    with SteppedRos() as r:
        yield r
