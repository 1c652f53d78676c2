"""The inference node's worker: the one thread that touches the engine.

It takes the frame loop's next job (waiting on the node's condition while
there is none), fits the job's observations (one per robot at most) to the
model, runs ``engine.step`` with the loop's plan, hands each robot's chunk to
that robot's action output and the tokens to the text router, and tells the
loop how the frame went. An exception in a frame is logged with its cause and
counted against the robots in it (every robot, for a language-only frame),
and the next frame runs; non-finite actions count against their robot only.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Optional

import numpy as np

from ..core.chunk_clock import NS_PER_S, Chunk, chunk_origin, unusable_stamp
from ..core.frame_loop import Arrival, FrameLoop, FramePlan, Job
from ..core.frame_records import FrameRecord
from ..core.frame_result import FrameError
from ..core.stats import Rolling, WindowRate
from . import conversions
from .process import lower_thread_priority
from .robot_io import RobotIO, TextRouter
from .text_output import end_events

#: seconds over which the worker's load (:attr:`FrameWorker.load`) is measured
LOAD_WINDOW_S = 5.0


class FrameWorker:
    """See the module doc. ``cond``: the node's condition (its lock guards the loop and
    the action output); ``now_ros()``: the node's clock in ns; ``frame_done()``: called
    after every engine step (the tick guard's)."""

    def __init__(self, *, cond: threading.Condition, loop: FrameLoop, robots: dict[str, RobotIO], text: TextRouter,
                 params: dict, now_ros: Callable[[], int], logger: Any,
                 frame_done: Optional[Callable[[], None]] = None):
        self._cond, self.loop, self._robots, self._text = cond, loop, robots, text
        self._params, self._now_ros, self._log = params, now_ros, logger
        self._frame_done = frame_done
        self.counters = loop.counters
        self.busy = False  # a frame is running (read by the tick under the lock)
        self._frame_began: Optional[float] = None  # time.monotonic() at the start of the frame running now
        self.frame_ms = Rolling(200)  # observation frames: engine time
        self.last_batch = 0.0  # mean decode batch of the last frame that decoded
        #: seconds of frames per second over the last 5 s (each frame counted when it ends): the
        #: worker's load, 1 when frames run back to back (:meth:`load_fraction`)
        self.load = WindowRate(LOAD_WINDOW_S)
        self._stop = False
        #: why the thread ended on its own (a fault outside a frame: a frame's own is counted and
        #: logged, and the worker goes on); None while it serves, and after a stop
        self.failure: Optional[str] = None
        self._thread = threading.Thread(target=self._run, name="oxygen-inference-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def frame_running_s(self) -> float:
        """How long the frame in flight has run so far (0.0 between frames): a frame that never
        ends (a stalled device, a compile, a lock held) shows here, as no finished frame's time can."""
        began = self._frame_began
        return 0.0 if began is None else time.monotonic() - began

    def load_fraction(self) -> float:
        """The part of the last 5 s the worker ran frames (0..1)."""
        return min(1.0, self.load.rate(time.monotonic()))

    @property
    def alive(self) -> bool:
        """The worker thread is running."""
        return self._thread.is_alive()

    @property
    def died(self) -> bool:
        """The thread was started and ended without :meth:`stop` (a fault): not merely not
        started yet (a configured, inactive node) or stopped (deactivated)."""
        return self._thread.ident is not None and not self._thread.is_alive() and not self._stop

    @property
    def death(self) -> Optional[str]:
        """Why the thread ended on its own (:attr:`failure`, or that it ended), None unless it :attr:`died`."""
        return (self.failure or "the thread ended") if self.died else None

    @property
    def stopped(self) -> bool:
        """:meth:`stop` was called (a worker runs once: a new one takes over)."""
        return self._stop

    def stop(self, timeout: float = 60.0) -> bool:
        """Stop after the frame in flight; True when the thread has ended."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001  said where it is seen: the log, /diagnostics, oxygen-agent
            self.failure = f"{type(exc).__name__}: {exc}"
            trace = "".join(traceback.format_exception(exc))
            self._log.fatal(f"the frame worker stopped: {self.failure}: no frame runs any more, no new action goes "
                            f"out\n{trace}")

    def _serve(self) -> None:
        self.load.add(time.monotonic(), 0.0)  # the load counts from the worker's start
        why = lower_thread_priority(self._params["worker_niceness"])
        if why:
            self._log.warning(f"worker_niceness: the worker thread keeps the node's priority: {why}")
        while True:
            job = self._wait_for_job()
            if job is None:
                return
            began = self._frame_began = time.monotonic()
            try:
                self._run_frame(job)
            except Exception as exc:  # keep serving; the error is reported
                self._frame_error(job, exc)
            finally:
                ended, self._frame_began = time.monotonic(), None
                self.load.add(ended, ended - began)
                with self._cond:
                    self.busy = False
                    self.loop.frame_ended(time.monotonic_ns())

    def _wait_for_job(self) -> Optional[Job]:
        """The next job (marked busy), or None when stopping."""
        with self._cond:
            job = None
            while not self._stop:
                job = self.loop.next_job(self._now_ros(), time.monotonic_ns())
                if job is not None:
                    break
                self._cond.wait(timeout=self.loop.period_ns / NS_PER_S)
            if self._stop:
                if job is not None:  # its questions wait again: shutdown cancels them
                    self.loop.put_back(job)
                return None
            self.busy = True
            return job

    def _run_frame(self, job: Job) -> None:
        dequeued = time.monotonic_ns()
        if job.cancels:  # cancelled requests end before the frame: their slots are free for it
            self._cancel(job.cancels)
        observations, arrivals = self._model_inputs(job.observations)
        questions, refused = self.loop.questions(job, [a.robot for a in arrivals], self._now_ros())
        for q in refused:  # every question gets an answer: here its `rejected` end
            self._text.publish(end_events([q.client_id], "rejected", q.robot, q.refusal), self._now_ros())
        if not observations and not questions and not self.loop.engine_has_work():
            return
        with self._cond:
            plan = self.loop.plan(bool(observations))
        started = time.monotonic_ns()
        result, error = self._step(observations, questions, plan, arrivals)
        finished, now_ros = time.monotonic_ns(), self._now_ros()
        for arrival in arrivals:  # (a failed frame's too: the engine keeps its observations for questions)
            self._text.observed(arrival.robot, result.frame_id, arrival.seq, arrival.stamp_ros_ns)
        if error is None:  # a failed frame's times say nothing of the next one's
            with self._cond:
                self.loop.frame_ran(plan, result, bool(observations))
        pushed, non_finite = set(), set()
        for arrival, actions in zip(arrivals, result.actions):  # a failed frame's: those denoised
            if not np.all(np.isfinite(actions)):
                non_finite.add(arrival.robot)
                self._robots[arrival.robot].counters["actions_non_finite"] += 1
                self._frame_failed(f"frame {result.frame_id} (observation {arrival.seq}): non-finite actions "
                                   "(NaN or infinity: in the weights, the statistics or the state?), not published",
                                   arrival.robot)
                continue  # the other robots' chunks and the text are still good
            record = FrameRecord(result.frame_id, arrival.seq, arrival.received_ns, dequeued, started, finished,
                                 result.total_ms, result.paused_ms)
            self._push_chunk(arrival, actions, result, record, now_ros, len(arrivals))
            pushed.add(arrival.robot)
        if pushed and error is None:  # the engine time of a frame that gave a chunk (once, however many robots)
            self.frame_ms.add(result.total_ms)
        if result.batch_sizes:
            self.last_batch = sum(result.batch_sizes) / len(result.batch_sizes)
        self._text.publish(result.tokens, now_ros)  # a failed frame's: tokens already decoded
        if error is not None:
            self._frame_error(job, error, delivered=pushed, counted=non_finite)

    def _frame_error(self, job: Job, exc: Exception, delivered: set[str] = frozenset(),
                     counted: set[str] = frozenset()) -> None:
        """Count and log a failed frame for every robot of ``job`` (all, for a language-only
        frame). Only a frame that owed a robot its chunk counts towards stopping its action
        output: not a language-only frame, not a robot whose chunk was ``delivered`` all the same
        (the fault came after its actions), and not twice a robot ``counted`` already (a
        non-finite chunk)."""
        owed = [a.robot for a in job.observations]
        for robot in owed or list(self._robots):
            self._robots[robot].counters["frame_errors"] += 1
        kept = f" (the action chunks of {len(delivered)} robot(s) were published)" if delivered else ""
        what = "frame failed" if owed else "language-only frame failed (no action was due from it)"
        trace = "".join(traceback.format_exception(exc))
        self._log.error(f"{what}{kept}: {exc}\n{trace}", throttle_duration_sec=2.0)
        for robot in owed:
            if robot not in delivered and robot not in counted:
                self._frame_failed(f"{type(exc).__name__}: {exc}", robot)

    def _cancel(self, cancels: list) -> None:
        """End the requests of ``cancels`` ((robot, client) pairs) and announce their ends."""
        self._text.publish(self.loop.end_requests(cancels), self._now_ros())

    def converted(self, msg, seq: int, robot: str = ""):
        """The Observation of a message as it arrives, or None (counted, logged) when it is refused:
        converted on arrival, a bad message never replaces a good observation still waiting."""
        try:
            return conversions.msg_to_observation(msg)
        except ValueError as exc:  # ObservationError, ImageError: never fed to the model
            self._refused(seq, exc, robot)
            return None

    def _refused(self, seq: int, exc: Exception, robot: str = "") -> None:
        self._robots[robot].counters["observations_invalid"] += 1
        whose = f"robot {robot}: " if robot else ""
        self._log.warning(f"{whose}observation {seq} refused: {exc}", throttle_duration_sec=5.0)

    def _model_inputs(self, arrivals: list[Arrival]) -> tuple[list, list[Arrival]]:
        """([Observation], [Arrival]) for the model: those of ``arrivals`` that fit it (the
        others, with too many cameras or a state the statistics cannot take, are refused)."""
        observations, kept = [], []
        for arrival in arrivals:
            try:
                observations.append(self.loop.fit_observation(arrival.payload, arrival.seq))
            except ValueError as exc:
                self._refused(arrival.seq, exc, arrival.robot)
                continue
            kept.append(arrival)
        return observations, kept

    def _step(self, observations: list, questions: list, plan: FramePlan, arrivals: list[Arrival]):
        """(the frame's result, None), or for a frame that failed (what it produced before
        failing, its FrameError): chunks already denoised and tokens already decoded still go out."""
        try:
            return self.loop.engine.step(observations, questions, start_language=plan.start_language,
                                         decode_steps=plan.decode_steps, denoise_steps=plan.denoise_steps,
                                         robots=[a.robot for a in arrivals],
                                         noise_seeds=[a.noise_seed for a in arrivals]), None
        except FrameError as exc:
            return exc.result, exc
        finally:
            if self._frame_done is not None:
                self._frame_done()

    def _push_chunk(self, arrival: Arrival, actions: np.ndarray, result, record: FrameRecord, now_ros: int,
                    observations: int) -> None:
        period, stamp, io = self.loop.period_ns, arrival.stamp_ros_ns, self._robots[arrival.robot]
        timing = dict(stamp_ns=stamp, received_ns=arrival.received_ros_ns, period_ns=period, horizon=self.loop.horizon)
        origin = chunk_origin(self._params["chunk_origin"], **timing)
        if self._params["chunk_origin"] == "observation" and origin is None:
            self._unanchored(arrival, unusable_stamp(**timing), first=io.counters["frames"] == 0)
        # a stamp too old to compensate is still on this clock when max_observation_age let it through
        on_clock = origin is not None or (stamp > 0 and stamp <= arrival.received_ros_ns + period
                                          and self.loop.settings.max_observation_age > 0)
        chunk = Chunk(actions, period, origin, frame_id=result.frame_id, observation_seq=arrival.seq,
                      observation_stamp_ns=stamp, ready_ns=now_ros, stamp_on_clock=on_clock)
        with self._cond:
            if self._stop:  # stopped (deactivate): what it still computes is dropped, so it is not pushed
                return
            io.output.push(chunk)
            io.inputs.records.add(record)
            io.chunk_rate.add(time.monotonic(), 1)
            io.frame_share.append(1.0 / observations)
            self.loop.frame_succeeded(arrival.robot)
        io.counters["frames"] += 1

    def _unanchored(self, arrival: Arrival, why: str, first: bool = False) -> None:
        """Count and log (throttled) a chunk that starts at the frame's end for want of a usable stamp;
        the robot's ``first`` chunk at info: a camera node holds its first group while its inputs come up
        (a camera, the state), which leaves it older than its chunk at every start."""
        self._robots[arrival.robot].counters["chunks_from_frame_end"] += 1
        text = (f"{'robot ' + arrival.robot + ': ' if arrival.robot else ''}observation {arrival.seq}: {why}; its "
                "chunk starts at the frame's end instead, without delay compensation (chunk_origin)")
        if first:  # (a call of its own: the throttle is per call)
            self._log.info(text + " (the first: held while the camera node's inputs came up)")
        else:
            self._log.warning(text, throttle_duration_sec=5.0)

    def _frame_failed(self, reason: str, robot: str) -> None:
        """Count a failed frame of ``robot``; when the loop stops its action output, drop its chunk."""
        with self._cond:
            if self.loop.frame_failed(reason, robot):
                self._robots[robot].output.drop()
