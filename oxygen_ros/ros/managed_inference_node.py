"""The managed (lifecycle) inference node: ``oxygen_inference`` as nav2 and ros2_control run nodes.

The same node as :mod:`.inference_node`, driven by the ROS 2 lifecycle through its
services (``ros2 lifecycle set /oxygen_inference configure``, or a lifecycle manager):

* **unconfigured** (after start, and after cleanup): parameters only, no model;
  ``/diagnostics`` says so once a second (``unconfigured (lifecycle): waiting for the
  configure transition``; ERROR with the cause after a configure that failed). The
  parameters read at start can be set now, all but ``robots``, ``ask_action`` and
  ``autostart`` (:attr:`ManagedInferenceNode.configure_time`): the next configure reads
  them (another ``model_path``, or a mended one after a configure that failed); while
  configured such a change is refused, naming the way;
* ``configure`` loads and warms up the model, makes the publishers, subscriptions
  and the Ask action server -> **inactive**: observations and questions are
  received, nothing is published and no frame runs;
* ``activate`` starts the control tick, diagnostics and the frame worker ->
  **active**: actions and text go out;
* ``deactivate`` stops publishing (the frame in flight completes); running requests
  stay as they are and go on after the next ``activate``;
* ``cleanup`` ends every request (``cancelled`` on the text topic), removes the
  publishers and subscriptions and frees the engine and its KV pool;
* ``shutdown`` (from any state) does what the plain node does at exit; then the
  process ends (``node_main.run_control_node``), and a launch with it.

With ``autostart`` (the default, and what the launch file uses) the node configures
and activates itself at start, so it behaves like the plain node unless a manager
sets ``autostart: false``. A configure that fails (a model that does not load) is
logged with its cause and leaves the node unconfigured; with ``autostart`` it ends
the process, as the plain node would. So does an activate that is refused (its
control process died after the configure): with ``autostart`` nothing would ever
activate the node again.

A transition the node's state does not have (``configure`` when finalized, ``activate``
when unconfigured) is answered ``success: false`` with a warning naming the state and
what it allows. Jazzy's rclpy raised inside the service instead: the request got no
answer and the exception ended the executor's spin.
"""

import functools
import traceback

from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.lifecycle import LifecycleNodeMixin, TransitionCallbackReturn

from .inference_node import NODE_NAME, InferenceNode
from .inference_parameters import PARAMETERS
from .node_help import NodeHelp
from .node_main import run_control_node
from .parameters import ParameterError
from .qos import reliable
from .robots import robot_topic

SUCCESS, FAILURE = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE


def _said(transition):
    """A transition callback whose exception is logged with its traceback (rclpy turns it into
    ERROR without a word) and then raised: the node goes through :meth:`on_error`."""
    @functools.wraps(transition)
    def run(self, state):
        try:
            return transition(self, state)
        except Exception as exc:
            self.get_logger().error(f"{transition.__name__.removeprefix('on_')} failed: {exc!r}\n"
                                    f"{traceback.format_exc()}")
            raise
    return run


class ManagedInferenceNode(LifecycleNodeMixin, InferenceNode):
    """The inference node with a lifecycle (see the module doc). ``kwargs`` go to ``rclpy.node.Node``."""

    #: every parameter read at start but those the node holds for its life (its robots' Ask
    #: servers, autostart): set while unconfigured, the next configure reads them
    configure_time = frozenset(s.name for s in PARAMETERS if not s.dynamic) - {"robots", "ask_action", "autostart"}

    def __init__(self, **kwargs):
        InferenceNode.__init__(self, start=False, **kwargs)
        LifecycleNodeMixin.__init__(self)
        self.configure_error: Exception | None = None  # why the last configure failed
        self.activate_error: str | None = None  # why the last activate was refused
        self.lifecycle_error: str | None = None  # why a failed transition finalized the node
        self._refuse_transitions_not_available()
        # /diagnostics while unconfigured (before the first configure, after a cleanup or a failed
        # configure); once configured, the node's own timer publishes its status
        self._pub_unconfigured = self.create_publisher(DiagnosticArray, "/diagnostics", reliable(10))
        self.create_timer(1.0, self._publish_unconfigured, callback_group=MutuallyExclusiveCallbackGroup())
        for robot in self.params["robots"] or [None]:  # the Ask servers live as long as the node: until
            self._ask_server(robot_topic(robot, self.params["ask_action"]))  # configured, they refuse goals
        if self.params["autostart"]:
            try:
                if self.trigger_configure() != SUCCESS:
                    raise self.configure_error
                if self.trigger_activate() != SUCCESS:  # an inactive node would publish nothing, silently
                    raise RuntimeError(f"activate failed: {self.activate_error or 'see the error above'}")
            except BaseException:  # a failed configure, or Ctrl-C while starting: nothing left running
                super().destroy_node()
                raise
        else:
            name = self.get_fully_qualified_name()
            self.get_logger().info("unconfigured (autostart false): waiting for the configure and activate "
                                   f"transitions, e.g. `ros2 lifecycle set {name} configure`")

    @property
    def finalized(self) -> bool:
        """Whether the node was shut down (a ``shutdown`` transition, or a transition that raised:
        :attr:`lifecycle_error`): it takes no transition any more."""
        return self._state_machine.current_state[1] == "finalized"

    def _refuse_transitions_not_available(self) -> None:
        """Answer a change_state request for a transition the current state lacks with
        ``success: false`` and a warning, before rclpy's own handler (see the module doc)."""
        service = self._service_change_state
        handle = service.callback
        machine = self._state_machine

        def change_state(request, response):
            wanted = request.transition.id
            if request.transition.label:  # rclpy resolves a label in the current state, refusing cleanly
                return handle(request, response)
            available = {t[0]: t[1] for t in machine.available_transitions}
            if wanted in available:
                return handle(request, response)
            label = next((t[1] for t in machine.transition_graph if t[0] == wanted), "an unknown transition")
            state = machine.current_state[1]
            # by id: shutdown from unconfigured and from active are two transitions of one label
            has = ", ".join(f"{name} (id {id_})" for id_, name in sorted(available.items())) or "none"
            self.get_logger().warning(f"transition {wanted} ({label}) refused: not a transition of state {state} "
                                      f"(it has: {has})")
            response.success = False
            return response

        service.callback = change_state

    def unconfigured_status(self) -> tuple[tuple, dict]:
        """((level, message), figures) of the status published while unconfigured: OK while it
        waits for its configure, ERROR naming the cause after a configure failed."""
        from diagnostic_msgs.msg import DiagnosticStatus

        d = {"lifecycle_state": "unconfigured"}
        if self.configure_error is None:
            return (DiagnosticStatus.OK, "unconfigured (lifecycle): waiting for the configure transition"), d
        d["configure_error"] = str(self.configure_error)
        return (DiagnosticStatus.ERROR, f"unconfigured (lifecycle): the last configure failed: "
                                        f"{self.configure_error}"), d

    def _publish_unconfigured(self) -> None:
        if self.configured or self.finalized:
            return
        robots = self.params["robots"] if len(self.params["robots"]) > 1 else []  # as while inactive
        self._pub_unconfigured.publish(self._lifecycle_array(*self.unconfigured_status(), robots))

    def on_configure(self, state) -> TransitionCallbackReturn:
        self.configure_error = None
        try:
            self.configure()
        except Exception as exc:  # noqa: BLE001 - the transition fails, the node stays unconfigured
            self.configure_error = exc
            self.get_logger().error(f"configure failed: {exc}" if isinstance(exc, ParameterError)
                                    else f"configure failed: {exc!r}\n{traceback.format_exc()}")
            return FAILURE
        return SUCCESS

    @_said
    def on_activate(self, state) -> TransitionCallbackReturn:
        busy = self.activate_error = self.worker_still_running()
        if busy is not None:  # two workers would share the engine: the transition fails, the node stays inactive
            self.get_logger().error(f"activate refused: {busy}; try again when it has ended")
            return FAILURE
        why = self.activate_error = self.tick_unavailable()
        if why is not None:  # no action could go out: the transition fails, the node stays inactive
            self.get_logger().error(f"activate refused: {why}; clean up and configure again to start a new one")
            return FAILURE
        self.activate()
        self.get_logger().info("active: publishing actions and text")
        return SUCCESS

    @_said
    def on_deactivate(self, state) -> TransitionCallbackReturn:
        self.deactivate()
        self.get_logger().info("inactive: not publishing; requests kept")
        return SUCCESS

    @_said
    def on_cleanup(self, state) -> TransitionCallbackReturn:
        if not self._stop_worker():  # it waits for the frame once more; the engine is its until it ends
            self.get_logger().error(f"cleanup refused: {self.worker_still_running()}; try again when it has ended")
            return FAILURE
        self.cleanup()
        return SUCCESS

    @_said
    def on_shutdown(self, state) -> TransitionCallbackReturn:
        self.shutdown()
        return SUCCESS

    def on_error(self, state) -> TransitionCallbackReturn:
        """After a transition that raised: stop everything and end finalized (FAILURE), since
        what the failed transition left half done is no clean unconfigured state to start again
        from (a configure then would have made a second set of subscriptions)."""
        self.lifecycle_error = f"a transition failed in state {state.label}; the node is finalized"
        self.get_logger().error(f"lifecycle error in state {state.label}: stopping; the node is finalized "
                                "(start it again)")
        self.shutdown()
        return FAILURE


ABOUT = NodeHelp("managed_inference_node", NODE_NAME, (
    "the inference node as a lifecycle (managed) node: configure loads the model, activate starts the "
    "control tick, deactivate and cleanup undo them (ros2 lifecycle set). With autostart (the default) it "
    "configures and activates itself. Parameters read at configure can change while it is unconfigured."),
    PARAMETERS, ManagedInferenceNode.configure_time)


def main(args=None) -> int:
    """``ros2 run oxygen_ros managed_inference_node [--ros-args ...]``."""
    return run_control_node(ManagedInferenceNode, NODE_NAME, args, about=ABOUT)


if __name__ == "__main__":
    raise SystemExit(main())
