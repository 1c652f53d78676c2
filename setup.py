"""pip entry point of oxygen_ros: builds the package with its CMakeLists.txt.

Use it from the environment that holds the ROS 2 wheels (requirements.txt,
requirements-jazzy.txt)::

    python -m pip install --no-build-isolation --no-deps .

(`make venv` does exactly that.) It does not replace CMakeLists.txt: it runs
the same CMake build a colcon workspace runs, with the environment's prefix as
CMAKE_INSTALL_PREFIX, stages `cmake --install` with DESTDIR under
build/stage/ (OXYGEN_BUILD_DIR instead of build/ where set), and hands pip
the staged tree as a wheel:

- <site-packages>/oxygen_ros/ (the Python sources merged with the generated
  message modules) goes into the wheel's platlib;
- everything else (lib/oxygen_ros/<node>, bin/oxygen-*, lib/lib*.so,
  share/oxygen_ros/, share/ament_index/..., include/) goes into the wheel's
  data scheme, which pip installs under the environment's prefix.

So pip records every installed file: reinstalling replaces the old install
cleanly, and `pip uninstall oxygen_ros` removes it. The CMake build directory
(build/cmake/) is kept, so a rebuild is incremental.
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.command.install_data import install_data
except ImportError:  # setuptools < 65.6 has none of its own
    from distutils.command.install_data import install_data

ROOT = Path(__file__).resolve().parent
# OXYGEN_BUILD_DIR (default build/) holds the CMake build (cmake/) and the
# staged install (stage/); `make` gives each ROS 2 distribution its own, so
# that the venvs of two distributions do not rebuild each other's.
BUILD_DIR = Path(os.environ.get("OXYGEN_BUILD_DIR") or ROOT / "build")
CMAKE_BUILD_DIR = BUILD_DIR / "cmake"
STAGE_DIR = BUILD_DIR / "stage"
PACKAGE = "oxygen_ros"


def _version():
    text = (ROOT / "package.xml").read_text(encoding="utf-8")
    match = re.search(r"<version>\s*([^<\s]+)\s*</version>", text)
    if not match:
        raise RuntimeError("package.xml has no <version>")
    return match.group(1)


def _prefix():
    return Path(sys.prefix)


def _python_install_dir():
    """site-packages relative to the prefix, as ament_cmake_python computes it."""
    schemes = sysconfig.get_scheme_names()
    kwargs = {"vars": {"base": sys.prefix}}
    if "deb_system" in schemes or "osx_framework_library" in schemes:
        kwargs["scheme"] = "posix_prefix"
    elif "rpm_prefix" in schemes:
        kwargs["scheme"] = "rpm_prefix"
    return Path(os.path.relpath(sysconfig.get_path("purelib", **kwargs), sys.prefix))


def _staged_prefix():
    # DESTDIR staging: files land at $DESTDIR/<absolute prefix>/...
    return STAGE_DIR / str(_prefix()).lstrip(os.sep)


def _run(cmd, env):
    print("+ " + " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, env=env)


def _cmake_build_and_stage():
    """Configure, build and install (staged) with CMakeLists.txt; once per run."""
    if getattr(_cmake_build_and_stage, "done", False):
        return
    prefix = str(_prefix())
    env = dict(os.environ)
    paths = [p for p in env.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    env["AMENT_PREFIX_PATH"] = os.pathsep.join([prefix] + [p for p in paths if p != prefix])
    # cmake from PATH, else the one `pip install cmake` puts beside Python.
    search = os.pathsep.join([env.get("PATH", ""), os.path.dirname(sys.executable)])
    cmake = shutil.which("cmake", path=search)
    if cmake is None:
        raise RuntimeError("cmake not found (apt-get install cmake, or pip install 'cmake<4')")
    # A build directory configured for another prefix or Python caches that
    # prefix's package paths (<pkg>_DIR): start it afresh.
    cache = CMAKE_BUILD_DIR / "CMakeCache.txt"
    if cache.exists():
        text = cache.read_text(encoding="utf-8", errors="replace")
        wanted = {"CMAKE_INSTALL_PREFIX": prefix, "Python3_EXECUTABLE": sys.executable}
        if not all(re.search(rf"^{key}:\w+={re.escape(value)}$", text, re.M)
                   for key, value in wanted.items()):
            print(f"{CMAKE_BUILD_DIR} was configured for another prefix: removing it", flush=True)
            shutil.rmtree(CMAKE_BUILD_DIR)
    CMAKE_BUILD_DIR.mkdir(parents=True, exist_ok=True)
    _run(
        [
            cmake,
            "-S", ROOT,
            "-B", CMAKE_BUILD_DIR,
            f"-DCMAKE_INSTALL_PREFIX={prefix}",
            f"-DCMAKE_PREFIX_PATH={prefix}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DPYTHON_INSTALL_DIR={_python_install_dir().as_posix()}",
            "-DBUILD_TESTING=OFF",
            "-DCMAKE_BUILD_TYPE=Release",
        ],
        env,
    )
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    _run([cmake, "--build", CMAKE_BUILD_DIR, "--parallel", jobs], env)
    if STAGE_DIR.exists():
        shutil.rmtree(STAGE_DIR)
    _run([cmake, "--install", CMAKE_BUILD_DIR], dict(env, DESTDIR=str(STAGE_DIR)))
    _cmake_build_and_stage.done = True


def _copy_tree(src, dst, skip=()):
    """Copy src into dst (keeping modes); return the files written."""
    written = []
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        dirnames[:] = sorted(
            d for d in dirnames
            if (rel / d) not in skip and d != "__pycache__" and not d.endswith(".egg-info")
        )
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            target = Path(dst) / rel / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(dirpath) / name, target)
            written.append(str(target))
    return written


class CMakeBuild(build_ext):
    """Runs the CMake build; puts the merged Python package into build_lib."""

    def run(self):
        _cmake_build_and_stage()
        package_src = _staged_prefix() / _python_install_dir() / PACKAGE
        if not (package_src / "msg" / "__init__.py").exists():
            raise RuntimeError(f"CMake install did not produce {package_src}/msg")
        package_dst = Path(self.build_lib) / PACKAGE
        if package_dst.exists():
            shutil.rmtree(package_dst)
        self._outputs = _copy_tree(package_src, package_dst)

    def get_outputs(self):
        return list(getattr(self, "_outputs", []))

    def get_source_files(self):
        return []


class InstallPrefixData(install_data):
    """Installs the rest of the staged CMake install tree under the prefix."""

    def run(self):
        _cmake_build_and_stage()
        staged = _staged_prefix()
        site_packages = _python_install_dir()
        # site-packages is handled by CMakeBuild (minus rosidl's egg-info,
        # pip writes the dist-info instead).
        self.outfiles = _copy_tree(staged, self.install_dir, skip={site_packages})

    def get_outputs(self):
        return list(getattr(self, "outfiles", []))


class BinaryDistribution(Distribution):
    """The package holds compiled extensions (the message type support)."""

    def has_ext_modules(self):
        return True

    def has_data_files(self):
        return True

    def is_pure(self):
        return False


setup(
    name=PACKAGE,
    version=_version(),
    description="Serve a vision-language-action model on a robot through ROS 2",
    license="Apache-2.0",
    python_requires=">=3.10",
    distclass=BinaryDistribution,
    packages=[],
    cmdclass={"build_ext": CMakeBuild, "install_data": InstallPrefixData},
    zip_safe=False,
)
