"""The inference node (``oxygen_inference``): one model, one engine, a control-loop timer.

Inputs: ``observation_topic`` (``oxygen_ros/Observation``, from the camera node),
``question_topic`` (``oxygen_ros/Question``) and the ``ask_action`` action server
(``oxygen_ros/action/Ask``, :mod:`.ask_server`). Outputs: ``actions_topic``
(``oxygen_ros/ActionChunk``), ``text_topic`` (``oxygen_ros/TextToken``),
``/diagnostics`` (once a second) and, with ``joint_names``, ``trajectory_topic``.

How it runs
    :meth:`~InferenceNode.configure` loads and warms up the model (``warmup_frames``
    frames on a black image), makes the publishers and subscriptions and starts
    the control process (``control_process``, :mod:`.control_link`);
    :meth:`~InferenceNode.activate` starts the control tick at ``control_rate_hz``, in
    that process (or, without it, on a thread of this one: :mod:`.control_thread`),
    at real-time priority where allowed; every
    tick publishes an ``ActionChunk`` with the newest chunk's actions from the one
    due at this tick onward (:mod:`.action_output` explains the offset and stamp),
    and the worker thread (:mod:`.frame_worker`, the only thread that touches the
    engine), which runs what the frame loop (:mod:`oxygen_ros.core.frame_loop`)
    decides: a newer observation (fresher than ``max_observation_age``), waiting
    questions, or language requests still decoding. A tick never waits for the
    model. The plain node does both in its constructor; the managed one
    (:mod:`.managed_inference_node`) on its lifecycle transitions, which also
    deactivate (:meth:`~InferenceNode.deactivate`) and clean up
    (:meth:`~InferenceNode.cleanup`).

Several robots: with ``robots: [left, right]`` every robot gets the topics under
its own namespace (``/left/oxygen/observation`` ... :mod:`.robot_io`), its own
chunk clock, failures and diagnostics (:mod:`.inference_diagnostics`); one
tick serves every robot's output, and every frame serves the newest
observation of each robot that has one, together.

Parameters: :data:`.inference_parameters.PARAMETERS` (``config/agent.yaml``), checked at start
and on every change (:mod:`.parameters`). Observations are checked as they arrive; bad input,
stale data, overload and faults: the README's "Reliability". :meth:`InferenceNode.shutdown`
(also run by ``destroy_node``) stops the timers and the worker (the frame in flight
completes) and publishes ``cancelled`` for every unfinished request.
"""

import dataclasses
import gc
import sys
import threading
import time
import traceback
from typing import Optional

import torch
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node

from ..core.active_time import ActiveTime
from ..core.engine import Engine
from ..core.frame_loop import FrameLoop, LoopSettings
from ..core.stats import Rolling
from ..core.tick_guard import TickGuard
from .action_output import TickGrid
from .ask_server import AskServer
from .control_link import ControlLink
from .control_thread import ControlThread, uses_sim_time
from .frame_worker import FrameWorker
from .inference_diagnostics import InferenceDiagnostics
from .inference_inputs import InferenceInputs
from .inference_ticks import InferenceTicks
from .inference_parameters import PARAMETERS
from .inference_setup import (
    compile_pieces,
    demo_model_hold,
    engine_config,
    load_model,
    model_load_error,
    model_notes,
    startup_summary,
    warm_up,
)
from .inference_status import StatusReporter
from .node_help import NodeHelp
from .node_main import mark_logged, run_control_node
from .params_files import node_start
from .parameter_changes import changed_values, check_parameter_changes, log_changes
from .parameters import ParameterError, declare_parameters
from .process import destroy_after_interrupt, settle_garbage_collector, thaw_garbage_collector
from .qos import reliable
from .robot_io import RobotIO, TextRouter
from .text_output import end_events

NODE_NAME = "oxygen_inference"


def _loop_settings(p: dict) -> dict:
    """The node's parameters that are the frame loop's settings (denoise_steps 0: the checkpoint's)."""
    out = {k: v for k, v in p.items() if k in LoopSettings.__dataclass_fields__}
    if "denoise_steps" in out:
        out["denoise_steps"] = out["denoise_steps"] or None
    return out


class InferenceNode(InferenceInputs, InferenceDiagnostics, InferenceTicks, Node):
    """See the module doc. ``kwargs`` go to ``rclpy.node.Node`` (context,
    parameter_overrides, cli_args, namespace, ...). The frame policy is
    :attr:`loop` (a :class:`~oxygen_ros.core.frame_loop.FrameLoop`), run by
    :attr:`worker`; :attr:`robot_io` holds each robot's outputs (what the control
    tick publishes) and inputs."""

    #: how long a deactivate, cleanup or shutdown waits for the frame in flight to end (a
    #: recompile or a stalled GPU can hold one that long)
    worker_stop_timeout_s = 60.0
    #: parameters read at start that may change while the node is unconfigured, for its next
    #: configure (none here: this node configures in its constructor; the managed node's)
    configure_time: frozenset[str] = frozenset()

    def __init__(self, start: bool = True, **kwargs):
        super().__init__(NODE_NAME, **kwargs)
        self._shutdown_done = False
        self.worker: Optional[FrameWorker] = None
        self.configured = self.active = False
        self.configurations = 0  # configures done: each brings new counters (a cleanup drops the old)
        self.ticking = ActiveTime()  # the seconds the control tick ran (active), over the node's life
        self._own_timers: list = []
        self._control: Optional[ControlThread] = None  # the control tick's thread, while active
        self._link: Optional[ControlLink] = None  # the control process, while configured (control_process)
        self._entities: list = []  # the publishers and subscriptions that configure() made
        self._ask_servers: dict[str, AskServer] = {}  # by action name: they live as long as the node
        try:
            self.params = declare_parameters(self, PARAMETERS, configurable=self.configure_time,
                                             start=node_start(NODE_NAME, kwargs))
            check_parameter_changes(self, PARAMETERS, lambda: self.params, self.configure_time,
                                    lambda: not self.configured)
            self.add_post_set_parameters_callback(self._apply_parameters)
            if start:  # the plain node: configured and active from the start (the managed one waits)
                self.configure()
                self.activate()
        except BaseException as exc:
            if isinstance(exc, Exception):  # the cause, in the node's log (not printed again by main)
                self.get_logger().fatal(f"start-up failed: {exc}" if isinstance(exc, ParameterError)
                                        else f"start-up failed: {exc!r}\n{traceback.format_exc()}")
                mark_logged(exc)
            InferenceNode.destroy_node(self)  # a Ctrl-C in activate too: the control process and its memory go
            raise

    # ------------------------------------------------------------------ configure / activate / ...
    def configure(self) -> None:
        """Load the model, build the engine and the frame loop, compile and warm up, make the
        publishers and subscriptions, and open the Ask action server (nothing is published until activate)."""
        p = self.params
        torch.set_num_threads(p["threads"])
        t0 = time.perf_counter()
        try:
            self.loaded = load_model(p)
        except ParameterError:
            raise
        except Exception as exc:  # torch / safetensors / out of memory: say which model and why
            raise model_load_error(p, exc) from exc
        self.get_logger().info(f"model loaded in {(time.perf_counter() - t0) * 1e3:.0f} ms")
        mc, normalizer = self.loaded.config, self.loaded.normalizer
        self.horizon = mc.action_horizon
        action_dim = self._action_dim(p)
        self.engine = Engine(self.loaded.model, self.loaded.tokenizer, engine_config(p), normalizer=normalizer)
        self.loop = FrameLoop(self.engine, LoopSettings(**_loop_settings(p)), mc.max_token_len, horizon=self.horizon,
                              state_dim=getattr(normalizer, "state_dim", None), log=self.get_logger(),
                              robots=p["robots"] or [""], seed=p["seed"])
        self.counters = self.loop.counters
        self.get_logger().info(self.engine.memory_note)
        compile_pieces(self.engine, p["compile"], self.get_logger())
        if p["warmup_frames"] > 0:
            ms = warm_up(self.engine, p["warmup_frames"], p["steps_per_frame"])
            self.get_logger().info(f"warmed up: {p['warmup_frames']} frames in {ms:.0f} ms")
        settle_garbage_collector()  # the model's and the compiled graphs' objects: before the first tick
        try:
            self._open_link(p, action_dim)
            # frames yield to a tick sharing their process only
            self._tick_guard = TickGuard() if p["yield_to_ticks"] and self._link is None else None
            self.engine.pause_point = None if self._tick_guard is None else self._tick_guard.pause_point
            before = set(self.publishers) | set(self.subscriptions)
            self._init_interfaces(p)
            self._entities = [e for e in (*self.publishers, *self.subscriptions) if e not in before]
        except BaseException:  # a fault, or Ctrl-C: no control process and shared memory left behind
            self._close_link()
            thaw_garbage_collector()
            raise
        with self._cond:
            self.configured = self._inputs_open = True
            self.configurations += 1
        # /diagnostics from now until cleanup: while inactive, a status that says so
        self._own_timers = [self.create_timer(1.0, self._publish_diagnostics,
                                              callback_group=MutuallyExclusiveCallbackGroup())]
        self.get_logger().info(startup_summary(self.loaded, p, self.resolve_topic_name))

    def _action_dim(self, p: dict) -> int:
        """The published actions' dimension (the statistics', else the model's), with joint_names
        checked against it and what the start-up says of the model said."""
        normalizer = self.loaded.normalizer
        action_dim = normalizer.action_dim if normalizer is not None else self.loaded.config.action_dim
        if len(p["joint_names"]) > action_dim:
            raise ParameterError("joint_names", f"{len(p['joint_names'])} names for actions with "
                                 f"{action_dim} dimensions")
        for warn, line in model_notes(p, self.loaded, action_dim, self.resolve_topic_name):
            if warn:
                self.get_logger().warning(line)
            else:  # rclpy refuses one call site logging at two severities
                self.get_logger().info(line)
        return action_dim

    def _init_interfaces(self, p: dict) -> None:
        # the lock guards the loop and the action outputs, shared by the tick, the inputs and the worker
        self._cond = threading.Condition(threading.Lock())
        self.tick_lateness_ms = Rolling(60_000)  # 20 min at 50 Hz (the agent's report reads them all)
        self._grid = TickGrid(self.counters, sim_time=uses_sim_time(self))  # /clock's jumps start it again
        inputs = MutuallyExclusiveCallbackGroup()
        self.robot_io = {name: RobotIO(self, robot, p, on_observation=self._on_observation,
                                       on_question=self._on_question, on_ask=self._on_ask,
                                       on_cancel=self._cancel_ask, inputs_group=inputs, ask_server=self._ask_server,
                                       make_output=None if self._link is None else self._link.output)
                         for name, robot in self.loop.robots.items()}
        self.text = TextRouter(list(self.robot_io.values()))
        several = len(self.robot_io) > 1
        self._status = StatusReporter("") if several else next(iter(self.robot_io.values())).status
        self.worker = self._new_worker()
        self._pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", reliable(10))

    def _new_worker(self) -> FrameWorker:
        return FrameWorker(
            cond=self._cond, loop=self.loop, robots=self.robot_io, text=self.text, params=self.params,
            now_ros=self._now_ros, logger=self.get_logger(),
            frame_done=None if self._tick_guard is None else self._tick_guard.frame_done)

    def _ask_server(self, action: str) -> AskServer:
        """The node's Ask server on ``action``, made on first use (a cleanup closes it, and the
        next configure opens it again: see :mod:`.ask_server`)."""
        server = self._ask_servers.get(action)
        if server is None:
            server = self._ask_servers[action] = AskServer(self, action, MutuallyExclusiveCallbackGroup())
        return server

    def activate(self) -> None:
        """Start the control tick and the frame worker: actions and text go out (the full
        /diagnostics status with them)."""
        self.worker = self._new_worker() if self.worker.stopped else self.worker  # a thread runs once
        self._start_ticks()
        self._restart_statuses()
        self.worker.start()
        self.active = True

    def deactivate(self) -> None:
        """Stop publishing: the tick goes, the worker stops after its frame; /diagnostics says inactive.
        Requests stay as they are (they go on after activate); inputs are still received.
        Every robot's chunk is dropped once the worker has stopped (the frame in flight's too):
        after the next activate no action computed before it goes out, not even held."""
        self.active = False  # first: a diagnostics callback meanwhile reports inactive, not a silent tick
        self._stop_ticks()
        self._stop_worker()
        with self._cond:
            for io in self.robot_io.values():
                io.output.drop()

    def cleanup(self) -> None:
        """Back to unconfigured: every request ends ``cancelled`` (published; an Ask goal gets its
        result), the publishers and subscriptions go, the Ask servers refuse goals, and the engine
        and its KV pool are freed."""
        if self.active:
            self.deactivate()
        self._close_inputs()
        for io in self.robot_io.values():
            io.ask.close()  # the server stays (see ask_server.py): a goal's result needs it after this
        self._announce_cancellations(self._cancel_everything(), "cleanup")  # the goals' results go out
        for entity in self._entities:
            (self.destroy_publisher if entity in set(self.publishers) else self.destroy_subscription)(entity)
        self._entities = []
        self._close_link()
        for timer in self._own_timers:
            self.destroy_timer(timer)
        self._own_timers = []
        self.worker, self.configured = None, False
        del self.engine, self.loop, self.loaded, self.robot_io, self.text
        thaw_garbage_collector()  # configure froze the model's objects: a collection could not free them
        gc.collect()  # the pool's tensors go now, not at some later collection

    # ------------------------------------------------------------------ parameters at run time
    def _apply_parameters(self, parameters) -> None:
        """After the parameter callback accepted them (same checks as at start)."""
        # a parameter read at configure changes while unconfigured only (else it was set as it is)
        changes = changed_values(PARAMETERS, parameters, () if self.configured else self.configure_time)
        if not changes:
            return
        before = {name: self.params.get(name) for name in changes}
        if not self.configured:  # read by configure()
            self.params.update(changes)
            log_changes(self, changes, " (for the next configure)", before)
            return
        with self._cond:
            self.params.update(changes)
            self.loop.configure(**_loop_settings(changes))
            self._tick_settings_changed(changes)
            self._cond.notify_all()
        if "hold_action" in changes and (note := demo_model_hold(self.params, self.loaded)):
            self.get_logger().warning(note)
        log_changes(self, changes, before=before)

    @property
    def diagnostics_timer(self):
        """The diagnostics' timer while configured (cancelled by :meth:`shutdown`), else None."""
        return self._own_timers[0] if self._own_timers else None

    # ------------------------------------------------------------------ shutdown
    def _stop_worker(self) -> bool:
        """Stop the worker (the frame in flight completes); True when it has ended. A worker that
        goes on past :attr:`worker_stop_timeout_s` pushes no chunk any more (what a deactivate
        drops)."""
        timeout = self.worker_stop_timeout_s
        if self.worker is None or self.worker.stop(timeout):
            return True
        self.get_logger().error(f"the frame worker did not end its frame within {timeout:g} s: its actions will "
                                "not go out, and an activate or cleanup is refused until it has ended")
        return False

    def worker_still_running(self) -> Optional[str]:
        """Why the node cannot activate or clean up yet: the worker stopped by the last
        deactivate is still in its frame (a second worker would share the engine with it).
        None: it has ended."""
        w = self.worker
        if w is not None and w.stopped and w.alive:
            return "the frame worker is still in the frame that was running at the last deactivate"
        return None

    def shutdown(self) -> None:
        """Stop the timers and the worker; publish ``cancelled`` for every unfinished request."""
        if self._shutdown_done:
            return
        self._shutdown_done = True
        t0 = time.perf_counter()
        if self.configured:
            self._close_inputs()
        for timer in self._own_timers:
            timer.cancel()
        self._halt_ticks()
        stopped = self._stop_worker()
        self.stop_ms = (time.perf_counter() - t0) * 1e3  # timers and worker stopped
        if not stopped or not self.configured:
            return  # the engine is still in use (do not touch it), or there is none
        self._announce_cancellations(self._cancel_everything(), "shutdown")

    def _cancel_everything(self) -> list:
        """End every running, queued and waiting request: their ``cancelled`` events."""
        with self._cond:  # a client's cancel on another executor thread takes requests out too
            events = list(self.engine.cancel_all())
            pending = self.loop.take_questions()
        return events + [e for q in pending for e in end_events([q.client_id], "cancelled", q.robot)]

    def _announce_cancellations(self, events: list, why: str) -> None:
        events = [e if e.detail else dataclasses.replace(e, detail=f"ended by the node's {why}") for e in events]
        try:
            if events:
                self.text.publish(events, self._now_ros())
        except Exception as exc:  # context already shut down
            print(f"{NODE_NAME}: could not publish {len(events)} cancellations: {exc}", file=sys.stderr)
            return
        what = f"{len(events)} requests cancelled" if events else "no request to cancel"
        try:  # the context may be gone already
            self.get_logger().info(f"{why}: {what}" + (f"; timers and worker stopped in {self.stop_ms:.0f} ms"
                                                       if why == "shutdown" else ""))
        except Exception:  # noqa: BLE001
            return
        if events:  # the process may exit right after: let reliable subscribers receive them
            self.text.flush(1.0)

    def destroy_node(self):
        try:
            self.shutdown()
        finally:
            if self._control is not None:
                self._control.destroy()
            self._close_link()
            for server in self._ask_servers.values():
                server.destroy()
            destroy_after_interrupt(super().destroy_node)  # a Ctrl-C in start-up may have broken it
            # configure froze this node's objects, its context's among them: frozen, a context
            # is never freed, nor its DDS participant (a process that makes nodes one after
            # another, a test suite, would keep them all, each still discovering)
            thaw_garbage_collector()


ABOUT = NodeHelp("inference_node", NODE_NAME, (
    "runs the model on each Observation (observation_topic) and publishes an ActionChunk every control tick "
    "(actions_topic, at control_rate_hz) and the text of questions and subtask descriptions (text_topic, "
    "TextToken); questions come on question_topic and as the Ask action (ask_action); its status on "
    "/diagnostics. It loads the model and starts ticking at once; managed_inference_node is the same as a "
    "lifecycle node."), PARAMETERS)


def main(args=None) -> int:
    """``ros2 run oxygen_ros inference_node [--ros-args ...]``."""
    return run_control_node(InferenceNode, NODE_NAME, args, about=ABOUT)


if __name__ == "__main__":
    sys.exit(main())
