"""The inference node's control tick: in the control process, or on a thread of the node.

With ``control_process: true`` (the default) the tick runs in a process of its own
(:mod:`.control_link`, :mod:`.control_process`): the node starts it when configured,
lets it tick while active, hands it ``control_rate_hz`` and ``hold_action`` changes and
brings its figures back before anything reads them (:meth:`InferenceTicks._sync_ticks`).
Otherwise (``control_process: false``, ``use_sim_time``, or a process that did not
start) the tick runs on a thread of the node's process (:mod:`.control_thread`) over the
robots' :class:`~.action_output.ActionOutput`, and also wakes the worker for idle
decoding and lets the tick guard's waiting frame go on.
"""

from __future__ import annotations

import time
from typing import Optional

from .control_link import ControlLink, ControlProcessError
from .control_thread import ControlThread, uses_sim_time
from .robots import robot_topic


class InferenceTicks:
    """The control-tick half of :class:`~.inference_node.InferenceNode` (a mixin: it reads
    the node's lock, loop, robots, worker, parameters, tick grid and tick guard)."""

    _control: Optional[ControlThread] = None  # the control tick's thread, while active (no process)
    _link: Optional[ControlLink] = None  # the control process, while configured

    def _open_link(self, p: dict, action_dim: int) -> None:
        """Start the control process (paused till activate) as ``_link``, or leave ``_link``
        None: the tick runs on a thread of this process (``control_process`` false, simulated
        time, or it failed to start). The link is the node's from the moment its shared memory
        exists, so that :meth:`_close_link` frees it whatever stops the start (Ctrl-C while the
        process comes up included)."""
        if not p["control_process"]:
            return
        if uses_sim_time(self):
            self.get_logger().info("control_process: the control tick stays in this process with use_sim_time "
                                   "(its ticks follow /clock)")
            return
        names = list(self.loop.robots)
        self._link = ControlLink(self, p, [(robot_topic(n, p["actions_topic"]), robot_topic(n, p["trajectory_topic"]))
                                           for n in names], self.horizon, action_dim)
        try:
            self._link.start(self.loop.period_ns)
        except ControlProcessError as exc:
            self._close_link()
            self.get_logger().error(f"control_process: {exc}; the control tick runs in this process instead")

    def _start_ticks(self) -> None:
        """Ticks from now on (activate); the time inactive is no missed tick."""
        with self._cond:
            self._grid.rate_changed()
        self.ticking.start()
        if self._link is not None:
            self._link.run(True)
            return
        self._control = ControlThread(self, self.loop.period_ns, self._on_tick, self.params["control_priority"],
                                      self.get_logger())
        self._control.start()

    def _stop_ticks(self) -> None:
        """No tick any more until the next activate (the control process pauses)."""
        self.ticking.stop()
        if self._link is None:
            self._control.destroy()
            self._control = None  # the next activate starts a new one
            return
        self._link.run(False)
        with self._cond:
            self._sync_ticks()

    def _halt_ticks(self) -> None:
        """Shutdown: no tick starts any more; the control process is told to end (it ends while
        the worker ends its frame; :meth:`_close_link` waits for it)."""
        self.ticking.stop()
        if self._control is not None:
            self._control.stop()
        if self._link is not None:
            self._link.run(False)
            with self._cond:
                self._sync_ticks()  # the figures of its last ticks
            self._link.terminate()

    def _close_link(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None

    def _tick_settings_changed(self, changes: dict) -> None:
        """``control_rate_hz`` or ``hold_action`` changed (the lock held)."""
        if "control_rate_hz" in changes:
            self.counters["control_rate_changes"] += 1  # the agent's report: no one period in its window
            self._grid.rate_changed()
            if self._link is not None:
                self._link.set_period(self.loop.period_ns)
            elif self.active:
                self._control.period_ns = self.loop.period_ns
        if "hold_action" in changes and self._link is not None:
            self._link.set_hold(changes["hold_action"])

    def _sync_ticks(self) -> None:
        """With the control process: bring back what its ticks did (the lock held)."""
        if self._link is not None:
            self._link.sync(self.tick_lateness_ms, self.counters)

    # ------------------------------------------------------------------ what it tells
    @property
    def control(self) -> Optional[ControlThread]:
        """The control tick's thread (:mod:`.control_thread`; None before the first activate, and
        with the control process)."""
        return self._control

    @property
    def control_silent_s(self) -> float:
        """Seconds the control process has not ticked while it should (0: it ticks, or no process)."""
        return 0.0 if self._link is None or not self.active else round(self._link.silent_s(), 3)

    def tick_unavailable(self) -> Optional[str]:
        """Why ticks cannot start (activate): the control process is gone; None when they can."""
        return None if self._link is None else self._link.failure

    @property
    def control_pid(self) -> Optional[int]:
        """The control process's pid (None: the tick runs on a thread of this process)."""
        return None if self._link is None else self._link.pid

    @property
    def control_failure(self) -> Optional[str]:
        """Why the control tick's thread (or process) stopped while the node is active (None while it runs)."""
        if self._link is not None:
            return self._link.failure if self.active else None
        control = self._control
        if control is None or control.alive or control.stopped or not self.active:
            return None
        return control.failure or "the control tick's thread stopped"

    @property
    def tick_period_ns(self) -> int:
        """The control tick's period now (``control_rate_hz``; 0 while not active)."""
        if not self.active:
            return 0
        return self.loop.period_ns if self._link is not None else self._control.period_ns

    # ------------------------------------------------------------------ the tick in this process
    def _on_tick(self, scheduled_ns: Optional[int], actual_ns: int) -> None:
        mono = time.monotonic_ns()
        on_grid = scheduled_ns
        try:
            on_grid = self._tick(scheduled_ns, actual_ns)  # the tick's time on the grid (a clock jump moves it)
        finally:
            if self._tick_guard is not None:  # a frame waiting for this tick may go on
                late = actual_ns - on_grid if on_grid is not None else 0
                self._tick_guard.tick_served(mono - late + self.loop.period_ns)

    def _tick(self, scheduled_ns: Optional[int], actual_ns: int) -> int:
        """One tick; its scheduled time, as the grid counted it."""
        with self._cond:
            scheduled_ns = self._grid.count(scheduled_ns, actual_ns, self.loop.period_ns)
            jump, self._grid.jump = self._grid.jump, None
            now = time.monotonic_ns()
            dues = [(io, io.output.tick(scheduled_ns, io.inputs.failures.stopped, now))
                    for io in self.robot_io.values()]
            if not self.worker.busy and self.loop.wants_language_frame():
                self._cond.notify_all()  # idle decoding is paced by the ticks
        self.tick_lateness_ms.add((actual_ns - scheduled_ns) / 1e6)
        for io, due in dues:
            if due is not None:
                io.output.publish(due)
        if jump is not None:
            self._clock_jumped(*jump)
        return scheduled_ns

    def _clock_jumped(self, from_ns: int, to_ns: int) -> None:
        """Say that /clock jumped (:class:`~.action_output.TickGrid`): one line a jump, at most every 10 s."""
        way = "forward" if to_ns > from_ns else "back"
        self.get_logger().info(
            f"use_sim_time: the clock jumped {way} {abs(to_ns - from_ns) / 1e9:.3f} s (from {from_ns / 1e9:.3f} s "
            f"to {to_ns / 1e9:.3f} s): the control tick's grid starts again there, no tick counted as missed",
            throttle_duration_sec=10.0)


__all__ = ["InferenceTicks"]
