"""A compiled library that would crash the process is tried in a child first and refused with the reason.

The libraries here are small C stand-ins for a package's library (the two
functions the probe calls), built with the machine's C compiler: one that
creates its container, one that crashes, one that crashes unless the C++
runtime is preloaded (what an H200 machine's CUDA packages did), one that
returns an error code, one that crashes unless a library this process loaded
(sqlite's) is loaded in the child too. The engine-level test (a refused library: the engine
runs eager and says why) is in test_compiled.py, on real packages.
"""

import os
import shutil
import subprocess

import pytest

from oxygen_ros.core.model import load_probe
from oxygen_ros.core.model.load_probe import LibraryLoadError, check_library_loads, cxx_runtime

STAND_IN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int crash(void) { volatile int *p = 0; return *p; }
static int loaded(const char *part) {  /* whether a file whose path holds ``part`` is mapped in this process */
    char line[4096];
    int found = 0;
    FILE *maps = fopen("/proc/self/maps", "r");
    while (maps && !found && fgets(line, sizeof line, maps)) found = strstr(line, part) != NULL;
    if (maps) fclose(maps);
    return found;
}
int AOTInductorModelContainerCreateWithDevice(void **h, size_t n, const char *dev, const char *kernels) {
    const char *pre = getenv("LD_PRELOAD");
    if (BEHAVIOUR == 1) return crash();
    if (BEHAVIOUR == 2 && !(pre && strstr(pre, "libstdc++"))) return crash();
    if (BEHAVIOUR == 3) return 1;
    if (BEHAVIOUR == 4 && !loaded("/_sqlite3")) return crash();
    *h = (void *)1;
    return 0;
}
int AOTInductorModelContainerDelete(void *h) { return 0; }
"""
BEHAVIOURS = {"loads": 0, "crashes": 1, "crashes-unless-preloaded": 2, "error-code": 3,
              "crashes-without-sqlite": 4}


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in libraries")
    folder = tmp_path_factory.mktemp("stand_ins")
    (folder / "lib.c").write_text(STAND_IN)
    out = {}
    for name, code in BEHAVIOURS.items():
        out[name] = folder / f"{name}.so"
        subprocess.run([compiler, "-shared", "-fPIC", f"-DBEHAVIOUR={code}", "-o", str(out[name]),
                        str(folder / "lib.c")], check=True)
    return out


@pytest.fixture
def probed_cpu(monkeypatch):
    """Probe the CPU's libraries too (by default only CUDA's are), with no verdict yet."""
    monkeypatch.setattr(load_probe, "PROBED_DEVICES", ("cpu",))
    monkeypatch.setattr(load_probe, "_verdicts", {})
    monkeypatch.delenv("LD_PRELOAD", raising=False)


def test_a_library_that_loads_is_let_through(stand_ins, probed_cpu):
    check_library_loads(stand_ins["loads"], "cpu", None)


def test_a_library_that_crashes_is_refused_naming_the_signal_and_the_library(stand_ins, probed_cpu):
    with pytest.raises(LibraryLoadError, match=r"crashes\.so: creating its model container on cpu killed a test "
                                               r"process \(SIGSEGV\).*also with the C\+\+ runtime preloaded"):
        check_library_loads(stand_ins["crashes"], "cpu", None)
    # the verdict stands for the process: the next library is refused without another child
    with pytest.raises(LibraryLoadError):
        check_library_loads(stand_ins["loads"], "cpu", None)


def test_a_library_that_loads_with_the_cxx_runtime_preloaded_says_how_to_start(stand_ins, probed_cpu):
    runtime = cxx_runtime()
    assert runtime and os.path.exists(runtime) and "libstdc++" in runtime  # torch brings it
    with pytest.raises(LibraryLoadError) as refused:
        check_library_loads(stand_ins["crashes-unless-preloaded"], "cpu", None)
    assert str(refused.value).endswith(f"It loads with the C++ runtime preloaded: start with LD_PRELOAD={runtime}")


def test_a_library_that_fails_without_crashing_is_left_to_say_why_itself(stand_ins, probed_cpu):
    check_library_loads(stand_ins["error-code"], "cpu", None)  # the load in this process reports the error


def test_only_the_probed_device_types_are_tried(stand_ins, monkeypatch):
    monkeypatch.setattr(load_probe, "_verdicts", {})
    assert "cpu" not in load_probe.PROBED_DEVICES and "cuda" in load_probe.PROBED_DEVICES
    check_library_loads(stand_ins["crashes"], "cpu", None)  # not tried: CPU libraries load in-process


def test_the_child_loads_the_native_libraries_this_process_has_loaded(stand_ins, probed_cpu):
    """A clash depends on the libraries the process holds (in a node: rclpy's and DDS's too), so the
    child imports this process's extension modules' packages, in their order, before the library."""
    import sqlite3  # noqa: F401  (a native library the model's imports do not load)

    packages = load_probe.loaded_packages()
    assert "_sqlite3" in packages and "torch" in packages and "__main__" not in packages
    assert len(packages) == len(set(packages))
    check_library_loads(stand_ins["crashes-without-sqlite"], "cpu", None)
