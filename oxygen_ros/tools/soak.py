"""``oxygen-soak``: the default agent under bad input and camera gaps, for as long as asked.

Usage::

    oxygen-soak --duration SECONDS [--json PATH] [--gap-every S] [--gap-s S] [--inject-every S]
                [--settle S] [name:=value ...]

Runs the nodes of ``oxygen-agent demo:=true`` (synthetic closed-loop camera,
camera node, inference node at the YAML's 50 Hz; ``name:=value`` are the
agent's launch arguments) in one process, plus a second camera node on a
compressed topic of its own (so that corrupt JPEG/PNG data goes through a
camera node too), and a soak node that:

* injects, one every ``--inject-every`` seconds in a fixed cycle (none in the last
  second, so that every question sent reaches the node before it shuts down), bad images of
  every kind (raw: unsupported encoding, zero size, empty data, too large,
  bad step, size mismatch; compressed: empty, not JPEG/PNG, truncated/corrupt
  JPEG, PNG of zero size or past the byte limit), bad states (NaN, inf, empty,
  too long, names disagreeing with positions), bad instructions (empty, 10,000
  characters, control characters, invalid UTF-8; the scene's instruction is
  restored right after), bad questions (empty, blank, control characters
  only, 10,000 characters, invalid UTF-8) and bad Observations sent straight
  to the inference node (NaN / too long state, names disagreeing with images,
  a bad image); and a valid question every other injection;
* pauses the synthetic camera for ``--gap-s`` seconds every ``--gap-every``
  seconds (a camera drop-out);
* counts on the subscriber side every TextToken per request and checks it
  against the request's final index (``tokens_lost``: tokens an ended request
  sent and this side did not get), every index against the one before
  (``token_index_gaps``: a message lost, repeated or out of order), and every
  question's end.

At the end (or on Ctrl-C / SIGTERM) the inference node is shut down (running
requests end ``cancelled``) and it prints, and with ``--json`` writes: control
ticks, underruns inside injected gaps (plus a recovery allowance of
``--gap-grace`` s) and outside them (``underruns_outside_gaps``), the recovery
after each gap (``recovery_ticks``, one per gap: control ticks from the
camera's first frame after the gap to the first tick that published an
ActionChunk from that frame or a later one; null when none went out before
the next gap or the end), frames, requests started / finished /
rejected / cancelled, tokens received, lost and index gaps, questions sent and how each
ended, what was injected and how each node counted it, and the resident
memory (``VmRSS``) after start-up, at the end of the ``--settle`` period
(the baseline: allocators and caches fill during the first seconds) and at the
end, with the growth in percent over the baseline. Exit status 1 when a
token was lost or an index skipped, a request or question never ended, or (runs of at least 120
s) memory grew by 5 % or more.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from ..core.chunk_clock import recovery_ticks
from ..ros.agent import Agent, run_agent
from ..ros.plan import parse_launch_args
from .arguments import non_negative_float, output_file, plain, positive_float, write_output

MEMORY_CHECK_MIN_S = 120.0
MAX_GROWTH_PCT = 5.0
PROGRESS_EVERY_S = 10.0
#: no message is injected in the last second: every question sent has reached the inference node
#: before it shuts down (it answers or cancels each one it received; one still on the wire would
#: never end, however well the node behaves)
QUIET_TAIL_S = 1.0


def rss_bytes() -> int:
    """Resident memory of this process (``VmRSS`` of /proc/self/status), 0 if unknown."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _mb(n: int) -> float:
    return round(n / 2**20, 1)


class SoakSession:
    """The soak's own part of the agent's start-up: a second camera node for compressed
    input and the soak node (:class:`.soak_node.Soak`); the main loop (injections,
    camera gaps, underruns inside and outside the gaps, memory samples); the report."""

    def __init__(self, ns: argparse.Namespace):
        self.ns = ns
        self.settle = ns.settle if ns.settle is not None else min(30.0, ns.duration / 10)
        self.soak = self.inference = self.synthetic = None
        self.t0 = time.monotonic()
        self.rss_launch, self.rss_start = rss_bytes(), None
        self.rss_samples: list[tuple[float, int]] = []
        self.windows: list[list[float]] = []  # injected camera gaps [start, end]
        self.gap_end: float | None = None  # end of the gap under way
        self.under_gap = self.under_out = 0
        self.resumed: list[int] = []  # ROS time at which each gap ended
        self.recovery: list[int | None] = []  # recovery_ticks, one per ended gap
        self.report: dict[str, Any] | None = None

    def start(self, agent: Agent) -> None:
        import rclpy
        from rclpy.parameter import Parameter

        from ..ros.camera_node import CameraNode
        from .soak_node import COMPRESSED_TOPIC, Soak

        inference, camera = agent.inference, agent.node("oxygen_camera")
        self.inference, self.synthetic = inference, agent.node("oxygen_synthetic_camera")
        compressed_camera = agent.add(CameraNode(  # corrupt JPEG/PNG data goes through a camera node of its own
            cli_args=["--ros-args", "-r", "__node:=oxygen_soak_compressed_camera"],
            parameter_overrides=[Parameter("image_topics", value=[]),
                                 Parameter("compressed_image_topics", value=[COMPRESSED_TOPIC]),
                                 Parameter("observation_topic", value="/oxygen_soak/observation"),
                                 Parameter("image_size", value=32),
                                 # it gets the injected data only: a rate warning every few seconds told nothing
                                 Parameter("min_camera_rate_hz", value=0.0)]))
        p = inference.params
        topics = {"image": camera.topics[0], "state": camera.state_topic or "/joint_states",
                  "instruction": camera.get_parameter("instruction_topic").value, "question": p["question_topic"],
                  "observation": p["observation_topic"], "text": p["text_topic"], "actions": p["actions_topic"]}
        soak_node = agent.add(rclpy.create_node("oxygen_soak"))
        self.soak = Soak(soak_node, inference, self.synthetic, [camera, compressed_camera], topics)

    def run(self, agent: Agent) -> int:
        from rclpy.executors import ExternalShutdownException

        ns, p = self.ns, self.inference.params
        self.rss_launch = rss_bytes()
        print(f"oxygen-soak: {ns.duration:g} s of the demo agent ({p['setting']}, {p['control_rate_hz']:g} Hz, "
              f"H={self.inference.horizon}) with {len(self.soak.cycle)} kinds of bad input every "
              f"{ns.inject_every:g} s and a {ns.gap_s:g} s camera gap every {ns.gap_every:g} s; RSS "
              f"{_mb(self.rss_launch)} MB", flush=True)
        self.t0 = time.monotonic()
        try:
            self._loop(agent, self.t0 + ns.duration)
        except (KeyboardInterrupt, ExternalShutdownException):
            print("oxygen-soak: interrupted: reporting what ran", flush=True)
        finally:
            if self.gap_end is not None:  # end the camera gap under way
                self.synthetic.pause(False)
        return 0

    def _loop(self, agent: Agent, end: float) -> None:
        ns, t0 = self.ns, self.t0
        next_inject, next_gap = t0 + 1.0, t0 + ns.gap_every
        last_underruns = self.inference.tick_counts()["underruns"]
        next_sample, next_print = t0, t0 + PROGRESS_EVERY_S
        while time.monotonic() < end:
            if not agent.alive():
                return  # run_agent says which node stopped and fails the run
            now = time.monotonic()
            if self.gap_end is None and now >= next_gap and now + ns.gap_s < end:
                self.synthetic.pause()  # the camera drops out
                self.gap_end = now + ns.gap_s
                self.windows.append([now, self.gap_end])
            elif self.gap_end is not None and now >= self.gap_end:
                self.resumed.append(self.synthetic.get_clock().now().nanoseconds)
                self.recovery.append(None)
                self.synthetic.pause(False)
                self.gap_end, next_gap = None, now + ns.gap_every
            elif self.gap_end is None:
                self._resolve_recovery()
            if now >= next_inject and now < end - QUIET_TAIL_S:
                self.soak.inject()
                next_inject += ns.inject_every
            self.soak.poll()
            last_underruns = self._count_underruns(now, last_underruns)
            if now >= next_sample:
                self._sample_memory(now)
                next_sample += 1.0
            if now >= next_print:
                self._progress(now)
                next_print += PROGRESS_EVERY_S
            time.sleep(0.02)

    def _resolve_recovery(self) -> None:
        """The last gap's recovery, once its first camera frame and a chunk from it are known."""
        if not self.recovery or self.recovery[-1] is not None:
            return
        frame = self.soak.first_camera_frame(self.resumed[-1])
        if frame is not None:
            first_ticks = self.inference.tick_counts()["first_ticks"]
            self.recovery[-1] = recovery_ticks(frame, first_ticks, self.inference.loop.period_ns)

    def _count_underruns(self, now: float, last: int) -> int:
        """Add the underruns since ``last`` to those inside a camera gap (plus its grace) or outside."""
        underruns = self.inference.tick_counts()["underruns"]
        if underruns != last:
            if any(a <= now <= b + self.ns.gap_grace for a, b in self.windows[-2:]):
                self.under_gap += underruns - last
            else:
                self.under_out += underruns - last
        return underruns

    def _sample_memory(self, now: float) -> None:
        rss = rss_bytes()
        if self.rss_start is None and now - self.t0 >= self.settle:
            self.rss_start = rss
        self.rss_samples.append((round(now - self.t0, 1), rss))

    def _progress(self, now: float) -> None:
        c, node = self.soak.counts(), self.inference
        print(f"  {now - self.t0:6.0f} s  ticks {node.tick_counts()['ticks']}  underruns {self.under_gap} in gaps "
              f"/ {self.under_out} outside  frames {node.counters['frames']}  requests {c['requests_started']}  "
              f"tokens {c['tokens_received']} (lost {c['tokens_lost']})  RSS {_mb(self.rss_samples[-1][1])} MB",
              flush=True)

    def finish(self, agent: Agent) -> None:
        """Shut the inference node down (running requests end ``cancelled``), wait for
        their ends to arrive, and make the report."""
        if self.soak is None:
            return
        elapsed = time.monotonic() - self.t0
        rss_end = rss_bytes()
        if self.gap_end is None:
            self._resolve_recovery()
        ticks = self.inference.tick_counts()
        self.inference.shutdown()
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and (self.soak.counts()["requests_open"]
                                               or self.soak.counts()["questions_unanswered"]):
            time.sleep(0.05)
        self.report = build_report(self, elapsed, ticks, rss_end)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, dict[str, str]]:
    parser = argparse.ArgumentParser(prog="oxygen-soak", description=plain(__doc__.split("\n\n")[0]))
    parser.add_argument("launch_args", nargs="*", metavar="name:=value",
                        help="oxygen-agent launch arguments (demo is always true)")
    parser.add_argument("--duration", type=positive_float, required=True, help="seconds to run")
    parser.add_argument("--json", type=output_file, default=None, help="also write the report here")
    parser.add_argument("--gap-every", type=positive_float, default=30.0,
                        help="seconds between camera gaps (default 30)")
    parser.add_argument("--gap-s", type=positive_float, default=3.0,
                        help="length of a camera gap in seconds (default 3)")
    parser.add_argument("--gap-grace", type=non_negative_float, default=2.0,
                        help="seconds after a gap whose underruns still count as the gap's (default 2)")
    parser.add_argument("--inject-every", type=positive_float, default=0.5,
                        help="seconds between two injected bad messages (default 0.5)")
    parser.add_argument("--settle", type=non_negative_float, default=None,
                        help="seconds before the memory baseline is taken (default: min(30, duration / 10))")
    ns = parser.parse_args(argv)
    if ns.settle is not None and ns.settle >= ns.duration:
        parser.error(f"--settle {ns.settle:g} must be shorter than --duration {ns.duration:g} (the memory baseline "
                     "is taken when it ends)")
    try:
        values = parse_launch_args(ns.launch_args)
    except ValueError as exc:
        parser.error(str(exc))
    if values.get("robots", "").strip():
        parser.error("robots:= is not supported: the soak injects its faults into one robot's camera side "
                     "(run it without robots:=)")
    values["demo"] = "true"
    return ns, values


def main(argv: list[str] | None = None) -> int:
    ns, values = parse_args(sys.argv[1:] if argv is None else argv)
    session = SoakSession(ns)
    try:
        code = run_agent("oxygen-soak", values, session)
    except Exception as exc:  # the report still says what ran
        print(f"oxygen-soak: {exc!r}", file=sys.stderr)
        code = 1
    if code == 2 or session.report is None:
        return code or 1
    report = session.report
    _print(report)
    if ns.json is not None:
        if not write_output(ns.json, json.dumps(report, indent=2) + "\n", "oxygen-soak"):
            code = code or 1
        else:
            print(f"oxygen-soak: report written to {ns.json}", flush=True)
    return code or (0 if all(report["checks"].values()) else 1)


def build_report(s: SoakSession, elapsed: float, ticks: dict[str, int], rss_end: int) -> dict[str, Any]:
    """What ran and how every part counted it, the memory, and the checks."""
    c = s.soak.counts()
    report = {"duration_s": round(elapsed, 1), "setting": s.inference.params["setting"],
              "control_rate_hz": s.inference.params["control_rate_hz"], "ticks": ticks["ticks"],
              **_counts(s, c, ticks), **_memory(s, rss_end)}
    report["checks"] = {
        "no_token_lost": report["tokens_lost"] == 0 and report["token_index_gaps"] == 0,
        "every_request_ended": c["requests_open"] == 0,
        "every_question_ended": c["questions_unanswered"] == 0,
        "memory_flat": elapsed < MEMORY_CHECK_MIN_S or _growth_pct(s, rss_end) < MAX_GROWTH_PCT,
    }
    return report


def _counts(s: SoakSession, c: dict[str, Any], ticks: dict[str, int]) -> dict[str, Any]:
    """The inference node's counts, the soak node's (``c``) and the cameras' rejections."""
    n = s.inference.counters
    return {
        "actions_published": n["actions_published"],
        "actions_received": c["actions_received"],
        "underruns": ticks["underruns"],
        "underruns_in_gaps": s.under_gap,
        "underruns_outside_gaps": s.under_out,
        "gaps": len(s.windows),
        "recovery_ticks": s.recovery + [None] * (len(s.windows) - len(s.recovery)),  # an interrupted gap: None
        "gap_s": s.ns.gap_s,
        "missed_ticks": n["missed_ticks"],
        "frames": n["frames"],
        "language_frames": n["language_frames"],
        "frame_errors": n["frame_errors"],
        "requests_started": c["requests_started"],
        "requests_finished": c["requests_finished"],
        "requests_rejected": c["requests_rejected"],
        "requests_cancelled": c["requests_cancelled"],
        "requests_open_at_end": c["requests_open"],
        "tokens_received": c["tokens_received"],
        "tokens_lost": c["tokens_lost"],  # of the requests ended: tokens their last index says were sent
        "token_index_gaps": c["index_gaps"],  # messages whose index did not follow the one before (lost, repeated)
        "questions_sent": c["questions_sent"],
        "questions_ended": c["questions_ended"],
        "questions_unanswered": c["questions_unanswered"],
        "injected": dict(sorted(s.soak.injected.items())),
        "camera_rejected": {cam.get_name(): {k: v for k, v in cam.rejected.items() if v} for cam in s.soak.cameras},
        "inference_refused": {k: n[k] for k in ("observations_invalid", "observations_stale", "instructions_truncated",
                                                "questions_rejected_empty", "questions_truncated",
                                                "questions_rejected_no_observation", "questions_rejected_stale",
                                                "actions_non_finite")},
        "hold_ticks": n["hold_ticks"],
        "k_last": s.inference.diagnostics()["k"],
    }


def _memory(s: SoakSession, rss_end: int) -> dict[str, Any]:
    """Resident memory at launch, at the end of the settle period (the baseline) and at the end."""
    samples = s.rss_samples
    return {
        "rss_launch_mb": _mb(s.rss_launch),
        "rss_start_mb": _mb(s.rss_start or s.rss_launch),
        "rss_end_mb": _mb(rss_end),
        "rss_max_mb": _mb(max([r for _, r in samples] + [rss_end])),
        "rss_growth_pct": round(_growth_pct(s, rss_end), 2),
        "rss_samples_mb": [(t, _mb(r)) for t, r in samples[:: max(1, len(samples) // 60)]],
    }


def _growth_pct(s: SoakSession, rss_end: int) -> float:
    """Growth of the resident memory at the end over the baseline, in percent (NaN: unknown)."""
    baseline = s.rss_start or s.rss_launch
    return (rss_end - baseline) / baseline * 100 if baseline else math.nan


def _print(r: dict[str, Any]) -> None:
    from .soak_node import VALID_QUESTION  # loaded by the run already (torch: not at this module's import)

    lines = [
        f"oxygen-soak: {r['duration_s']} s, setting {r['setting']}, {r['control_rate_hz']:g} Hz",
        f"  ticks                {r['ticks']} ({r['actions_published']} ActionChunks published, "
        f"{r['actions_received']} received; {r['missed_ticks']} missed by the timer)",
        f"  underruns            {r['underruns']}: {r['underruns_in_gaps']} in {r['gaps']} injected camera gaps of "
        f"{r['gap_s']:g} s, {r['underruns_outside_gaps']} outside "
        f"({100 * r['underruns_outside_gaps'] / max(1, r['ticks']):.1f} % of the ticks)",
        f"  recovery             {r['recovery_ticks']} control ticks from the camera's first frame after each gap "
        f"to the first ActionChunk",
        f"  frames               {r['frames']} observation frames, {r['language_frames']} language-only, "
        f"{r['frame_errors']} errors",
        f"  requests             started {r['requests_started']}, finished {r['requests_finished']}, rejected "
        f"{r['requests_rejected']}, cancelled {r['requests_cancelled']}, still open {r['requests_open_at_end']}",
        f"  tokens               received {r['tokens_received']}, lost {r['tokens_lost']}, index gaps "
        f"{r['token_index_gaps']}",
        f"  questions            sent {sum(r['questions_sent'].values())}, never ended {r['questions_unanswered']}: "
        f"{r['questions_ended']}",
        f"  injected             {sum(n for k, n in r['injected'].items() if k != VALID_QUESTION)} messages of "
        f"{len(set(r['injected']) - {VALID_QUESTION})} kinds of bad input, and "
        f"{r['injected'].get(VALID_QUESTION, 0)} valid questions",
        f"  rejected by cameras  {r['camera_rejected']}",
        f"  refused by inference {r['inference_refused']}",
        f"  memory (RSS)         launch {r['rss_launch_mb']} MB, start {r['rss_start_mb']} MB, end "
        f"{r['rss_end_mb']} MB ({r['rss_growth_pct']:+.2f} %), max {r['rss_max_mb']} MB",
        f"  checks               {r['checks']}",
    ]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
