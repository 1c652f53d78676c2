"""The inference node's worker: the one thread that touches the engine.

It takes the frame loop's next job (waiting on the node's condition while
there is none), converts the observation message, runs ``engine.step`` with
the loop's plan, hands the chunk to the action output and the tokens to the
text output, and tells the loop how the frame went. An exception in a frame
is logged with its cause and counted, and the next frame runs.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Optional

import numpy as np

from ..core.chunk_clock import NS_PER_S, Chunk, chunk_origin
from ..core.frame_loop import Arrival, FrameLoop, FramePlan, Job
from ..core.frame_records import FrameRecord
from ..core.stats import Rolling
from . import conversions
from .action_output import ActionOutput
from .text_output import TextOutput, end_events


class FrameWorker:
    """See the module doc. ``cond``: the node's condition (its lock guards the loop and
    the action output); ``now_ros()``: the node's clock in ns; ``frame_done()``: called
    after every engine step (the tick guard's)."""

    def __init__(self, *, cond: threading.Condition, loop: FrameLoop, output: ActionOutput, text: TextOutput,
                 params: dict, max_cameras: int, now_ros: Callable[[], int], logger: Any,
                 frame_done: Optional[Callable[[], None]] = None):
        self._cond, self.loop, self._output, self._text = cond, loop, output, text
        self._params, self._max_cameras, self._now_ros, self._log = params, max_cameras, now_ros, logger
        self._frame_done = frame_done
        self.counters = loop.counters
        self.busy = False  # a frame is running (read by the tick under the lock)
        self.frame_ms = Rolling(200)  # observation frames: engine time
        self.last_batch = 0.0  # mean decode batch of the last frame that decoded
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="oxygen-inference-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        """The worker thread is running."""
        return self._thread.is_alive()

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
        while True:
            job = self._wait_for_job()
            if job is None:
                return
            try:
                self._run_frame(job)
            except Exception as exc:  # keep serving; the error is reported
                self.counters["frame_errors"] += 1
                self._log.error(f"frame failed: {exc}\n{traceback.format_exc()}", throttle_duration_sec=2.0)
                self._frame_failed(f"{type(exc).__name__}: {exc}")
            finally:
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
            self._text.publish(self.loop.engine.requests.cancel_clients(job.cancels), self._now_ros())
        observations, arrival = self._model_inputs(job.observation)
        questions, refused = self.loop.questions(job, bool(observations))
        if refused:  # every question gets an answer: here its `rejected` end
            self._text.publish(end_events(refused, "rejected"), self._now_ros())
        if not observations and not questions and not self.loop.engine_has_work():
            return
        with self._cond:
            plan = self.loop.plan(bool(observations))
        started = time.monotonic_ns()
        result = self._step(observations, questions, plan)
        finished, now_ros = time.monotonic_ns(), self._now_ros()
        with self._cond:
            self.loop.frame_ran(plan, result, bool(observations))
        if arrival is not None and not np.all(np.isfinite(result.actions[0])):
            self.counters["actions_non_finite"] += 1
            self._text.publish(result.tokens, now_ros)  # the text is still good
            self._frame_failed(f"frame {result.frame_id} (observation {arrival.seq}): non-finite actions, "
                               "not published")
            return
        if arrival is not None:
            record = FrameRecord(result.frame_id, arrival.seq, arrival.received_ns, dequeued, started, finished,
                                 result.total_ms, result.paused_ms)
            self._push_chunk(arrival, result, record, now_ros)
        if result.batch_sizes:
            self.last_batch = sum(result.batch_sizes) / len(result.batch_sizes)
        self._text.publish(result.tokens, now_ros)

    def converted(self, msg, seq: int):
        """The Observation of a message as it arrives, or None (counted, logged) when it is refused:
        converted on arrival, a bad message never replaces a good observation still waiting."""
        try:
            return conversions.msg_to_observation(msg)
        except ValueError as exc:  # ObservationError, ImageError: never fed to the model
            self._refused(seq, exc)
            return None

    def _refused(self, seq: int, exc: Exception) -> None:
        self.counters["observations_invalid"] += 1
        self._log.warning(f"observation {seq} refused: {exc}", throttle_duration_sec=5.0)

    def _model_inputs(self, arrival: Optional[Arrival]) -> tuple:
        """([Observation], arrival) for the model, or ([], None) when there is none or it is refused
        (it does not fit the model: too many cameras, a state the statistics cannot take)."""
        if arrival is None:
            return [], None
        try:
            obs = self.loop.fit_observation(arrival.payload, self._max_cameras, arrival.seq)
        except ValueError as exc:
            self._refused(arrival.seq, exc)
            return [], None
        return [obs], arrival

    def _step(self, observations: list, questions: list, plan: FramePlan):
        try:
            return self.loop.engine.step(observations, questions, start_language=plan.start_language,
                                         decode_steps=plan.decode_steps, denoise_steps=plan.denoise_steps)
        except Exception as exc:
            # the engine's FrameError carries what the frame produced before failing:
            # tokens already decoded still go to their clients
            partial = getattr(exc, "result", None)
            if partial is not None and partial.tokens:
                self._text.publish(partial.tokens, self._now_ros())
            raise
        finally:
            if self._frame_done is not None:
                self._frame_done()

    def _push_chunk(self, arrival: Arrival, result, record: FrameRecord, now_ros: int) -> None:
        period, stamp = self.loop.period_ns, arrival.stamp_ros_ns
        origin = chunk_origin(self._params["chunk_origin"], stamp_ns=stamp, received_ns=arrival.received_ros_ns,
                              period_ns=period, horizon=self.loop.horizon)
        chunk = Chunk(result.actions[0], period, origin, frame_id=result.frame_id, observation_seq=arrival.seq,
                      observation_stamp_ns=stamp, ready_ns=now_ros)
        with self._cond:
            self._output.push(chunk)
            self.loop.records.add(record)
        self.frame_ms.add(result.total_ms)
        self.counters["frames"] += 1
        with self._cond:
            self.loop.frame_succeeded()

    def _frame_failed(self, reason: str) -> None:
        """Count a failed frame; when the loop stops the action output, drop the chunk."""
        with self._cond:
            if self.loop.frame_failed(reason):
                self._output.drop()
