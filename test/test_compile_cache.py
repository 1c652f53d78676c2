"""The compile cache across processes: a robot's read-only copy without a compiler, two builders at once.

A warm cache on a robot: loading a package needs neither a compiler nor a
writable cache (its library is extracted into a private folder), so such a
machine runs compiled; only a package the cache lacks needs them, and then
the engine runs eager and says which of the two is missing. The robot is a
child Python with no compiler (``CXX`` names none) over a read-only copy of
the packages: a read-only bind mount in a mount namespace of its own when
this runs as root (whom permissions do not stop), else the copy's
permissions.

Two builders: a process that finds another building into the same cache
waits for it, says so, and then builds only what the other did not.
"""

import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import time

import pytest

from oxygen_ros.core.child_env import child_env
from oxygen_ros.core.engine import Engine, EngineConfig

TEST_DIR = pathlib.Path(__file__).resolve().parent
#: the engine of test_compiled's cache tests: its packages are in the session's compile cache
COMMON = dict(setting="oxygen", max_decode=6, steps_per_frame=2, denoise_steps=2, max_active=3,
              max_observations_per_frame=1, language_every_n_frames=0, camera_names=("base",))

# argv: the result file, then the engine's max_active. Runs the engine compiled (and, when it did,
# eager beside it) and writes what a user would look at.
_ROBOT = """
import json, os, sys
sys.path.insert(0, {test_dir!r})
import numpy as np
from conftest import lively
from engine_harness import frames_with_questions
from oxygen_ros.core.engine import Engine, EngineConfig
from oxygen_ros.core.model.compile_setup import build_unavailable
from oxygen_ros.core.model.config import TINY
from oxygen_ros.core.model.vla import build_model
from oxygen_ros.core.tokenizer import Tokenizer

out, max_active = sys.argv[1], int(sys.argv[2])
cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
common = dict({common!r}, max_active=max_active)
model, tok = lively(build_model(TINY, seed=2)), Tokenizer.default()
engine = Engine(model, tok, EngineConfig(compile="on", **common))
progress, notes = [], []
engine.warm_up(lambda done, total, what: progress.append(what), notes.append)
result = dict(writable=os.access(cache, os.W_OK), compiler=build_unavailable("cpu"), progress=progress,
              notes=notes, compiled=engine.compiled is not None, reason=engine.compile_reason)
if engine.compiled is not None:
    lengths = [3, 0, 2, 3]
    a = frames_with_questions(engine, lengths, TINY.vision.image_size)
    b = frames_with_questions(Engine(model, tok, EngineConfig(compile="off", **common)), lengths,
                              TINY.vision.image_size)
    result.update(built=engine.compiled.built, graphs=engine.compiled.graphs, recompiles=engine.recompiles,
                  same_tokens=a[1] == b[1], tokens=len(a[1]),
                  action_diff=max(float(np.abs(x - y).max()) for x, y in zip(a[0], b[0])))
with open(out, "w") as f:
    json.dump(result, f)
"""


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory) -> pathlib.Path:
    """The session's compile cache, holding the packages of an engine of :data:`COMMON`."""
    cache_dir = tmp_path_factory.getbasetemp() / "compile-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache_dir))
        engine = tiny_engine(compile="on")
        engine.warm_up()  # from the cache when test_compiled filled it, else built here
        assert engine.compiled is not None, engine.compile_reason
    return cache_dir


def tiny_engine(**config) -> Engine:
    from conftest import lively
    from oxygen_ros.core.model.config import TINY
    from oxygen_ros.core.model.vla import build_model
    from oxygen_ros.core.tokenizer import Tokenizer

    return Engine(lively(build_model(TINY, seed=2)), Tokenizer.default(), EngineConfig(**COMMON, **config))


@pytest.fixture(scope="module")
def robot_cache(warm_cache, tmp_path_factory):
    """A copy of the packages of a warm cache (nothing extracted from them), read-only to the
    robot: (the copy, the command prefix that runs a child with it read-only)."""
    cache_dir = warm_cache
    copy = tmp_path_factory.mktemp("robot") / "cache"
    (copy / "aoti").mkdir(parents=True)
    for package in (cache_dir / "aoti").glob("*.pt2"):
        shutil.copy(package, copy / "aoti" / package.name)
    if os.geteuid() != 0:
        for path in [*copy.rglob("*"), copy]:
            path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        yield copy, []
        for path in [copy, *copy.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
        return
    if shutil.which("unshare") is None:
        pytest.skip("running as root without unshare: no way to make the cache read-only to the robot")
    mount = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    yield copy, ["unshare", "--mount", "sh", "-c", mount, "sh", str(copy)]


def run_robot(robot_cache, tmp_path, *, max_active: int, compiler: bool) -> dict:
    copy, prefix = robot_cache
    out = tmp_path / f"robot-{max_active}-{compiler}.json"
    env = child_env({"TORCHINDUCTOR_CACHE_DIR": str(copy)})
    env.pop("OXYGEN_COMPILE_CACHE", None)
    if not compiler:
        env["CXX"] = "/nonexistent/g++"
    script = _ROBOT.format(test_dir=str(TEST_DIR), common=COMMON)
    done = subprocess.run([*prefix, sys.executable, "-c", script, str(out), str(max_active)], env=env,
                          capture_output=True, text=True, timeout=600)
    if prefix and done.returncode != 0 and not out.exists() and "mount" in done.stderr:
        pytest.skip(f"no read-only bind mount here: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_a_warm_cache_runs_compiled_without_a_compiler_and_read_only(robot_cache, tmp_path):
    files_before = sorted(p.relative_to(robot_cache[0]) for p in robot_cache[0].rglob("*"))
    robot = run_robot(robot_cache, tmp_path, max_active=3, compiler=False)
    assert not robot["writable"] and "C++ compiler" in robot["compiler"], "the robot's premise"
    assert robot["compiled"], robot["reason"]
    assert robot["built"] == 0 and robot["graphs"] == 5 and robot["recompiles"] == 0
    assert robot["notes"] == [f"loading the 5 compiled shape buckets from the compile cache ({robot_cache[0]})"]
    assert robot["progress"] and all(w.endswith("(from the cache)") for w in robot["progress"])
    assert robot["same_tokens"] and robot["tokens"] > 0 and robot["action_diff"] <= 1e-5
    assert sorted(p.relative_to(robot_cache[0]) for p in robot_cache[0].rglob("*")) == files_before


def test_packages_the_cache_lacks_run_eager_naming_the_missing_compiler(robot_cache, tmp_path):
    robot = run_robot(robot_cache, tmp_path, max_active=5, compiler=False)  # another pool: other packages
    assert not robot["compiled"] and robot["progress"] == []
    assert robot["notes"] == [], "it said it would compile what it could not"
    assert robot["reason"].startswith("no working C++ compiler"), robot["reason"]
    assert f"the compile cache ({robot_cache[0]}) lacks" in robot["reason"]
    assert "cannot be built here" in robot["reason"]


def test_packages_a_read_only_cache_lacks_run_eager_saying_it_is_read_only(robot_cache, tmp_path):
    robot = run_robot(robot_cache, tmp_path, max_active=5, compiler=True)
    assert robot["compiler"] is None and not robot["compiled"] and robot["notes"] == []
    assert "and it is read-only" in robot["reason"] and "OXYGEN_COMPILE_CACHE" in robot["reason"], robot["reason"]


# argv: the packages to copy, the cache folder to copy them into, the file that says the lock is held,
# the file that says the other process waits for it. Holds the cache's build lock and "builds" (copies
# the packages in) only once the other process waits.
_BUILDER = """
import pathlib, shutil, sys, time
from oxygen_ros.core.model.build_lock import build_lock

packages, folder, held, waiting = map(pathlib.Path, sys.argv[1:5])
with build_lock(folder):
    held.touch()
    end = time.monotonic() + 120
    while not waiting.exists() and time.monotonic() < end:
        time.sleep(0.05)
    for package in packages.glob("*.pt2"):
        shutil.copy(package, folder / (package.name + ".part"))
        (folder / (package.name + ".part")).rename(folder / package.name)
"""


def test_a_second_builder_waits_for_the_first_and_builds_only_what_it_did_not(warm_cache, tmp_path, monkeypatch):
    folder = tmp_path / "cache" / "aoti"
    held, waiting = tmp_path / "held", tmp_path / "waiting"
    first = subprocess.Popen([sys.executable, "-c", _BUILDER, str(warm_cache / "aoti"), str(folder), str(held),
                              str(waiting)], env=child_env())
    try:
        end = time.monotonic() + 120
        while not held.exists() and first.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        assert held.exists(), "the first builder never took the lock"
        half = folder / "decode-0123.tmp.pt2"  # what a build killed with SIGKILL leaves
        half.write_bytes(b"half a package")
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder.parent))
        second, notes, progress = tiny_engine(compile="on"), [], []

        def note(text: str) -> None:
            notes.append(text)
            if text.startswith("waiting for"):
                waiting.touch()

        second.warm_up(lambda done, total, what: progress.append(what), note)
    finally:
        try:
            first.wait(timeout=120)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()
    assert first.returncode == 0
    assert notes[0].startswith(f"compiling 5 of the 5 shape buckets, those not in the compile cache "
                               f"({folder.parent}; "), notes  # as it saw the cache before it waited
    assert notes[1] == f"waiting for process {first.pid}, which is building packages into {folder} ..."
    assert notes[2].startswith(f"process {first.pid} finished building after ") and len(notes) == 3
    assert second.compiled is not None, second.compile_reason
    assert second.compiled.built == 0 and all(w.endswith("(from the cache)") for w in progress), progress
    assert not half.exists(), "a half-written package is removed under the lock"
