"""The camera node's rate figures and warnings (camera_status.py) on a clock the test moves."""

import math
from collections import deque

from oxygen_ros.core.grouping import PERIOD_STEPS, typical_period_ns
from oxygen_ros.ros.camera_status import RATE_WINDOW_S, CameraStatus


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _run(status: CameraStatus, clock: Clock, seconds: float, rate_hz: float | None, min_rate_hz: float = 5.0,
         every: int = 10):
    """Frames at ``rate_hz`` (None: none) for ``seconds``, the rates read every ``every`` tenths of
    a second (every second, as the node does); returns the warnings and the last rate read."""
    warnings, rate = [], math.nan
    step = 0.1
    for i in range(round(seconds / step)):
        clock.now += step
        if rate_hz and (i * step * rate_hz) % 1 < step * rate_hz:
            status.frame(0)
        if (i + 1) % every == 0:
            rate = status.figures("")["base.rate_hz"]
            warnings += status.rate_warnings(min_rate_hz)
    return warnings, rate


def test_a_camera_at_its_rate_is_measured_and_a_slow_one_is_warned_about():
    clock = Clock()
    status = CameraStatus(["base"], ["/camera"], ("decode",), clock=clock)
    warnings, rate = _run(status, clock, 6, 10.0)
    assert not warnings and abs(rate - 10) < 0.5
    warnings, rate = _run(status, clock, 6, 1.0)
    assert rate < 2 and warnings and "below min_camera_rate_hz 5" in warnings[0]


def test_a_camera_whose_publisher_comes_up_after_the_node_is_measured_from_its_first_frame():
    """A camera node started 2.5 s before its camera: at 10 Hz from then on, no 'below
    min_camera_rate_hz 8' warning for the frames the camera did not send before it came up. A camera
    that never sends is still warned of once the node has run that long."""
    clock = Clock()
    status = CameraStatus(["base", "wrist"], ["/camera", "/wrist"], ("decode",), clock=clock)
    warnings = []
    for i in range(85):  # read every second, as the node does; the base camera at 10 Hz from 2.5 s on
        clock.now += 0.1
        if i >= 25:
            status.frame(0)
        if i % 10 == 9:
            warnings += status.rate_warnings(8.0)
    assert [w for w in warnings if "base" in w] == [], warnings
    assert abs(status.figures("")["base.rate_hz"] - 10) < 0.5
    assert any("wrist" in w and "0.0 frames/s" in w for w in warnings), warnings


def test_a_stall_of_the_nodes_own_process_is_not_read_as_a_slow_camera():
    """oxygen-agent compiles the inference node's buckets in the camera node's process: for a
    minute no callback runs, then a burst of queued frames arrives. The rates start again."""
    clock = Clock()
    status = CameraStatus(["base"], ["/camera"], ("decode",), clock=clock)
    _run(status, clock, 4, 10.0)
    clock.now += 60.0  # the process is busy: no frame taken, no reading
    for _ in range(3):
        status.frame(0)  # the queued frames, at once
    warnings, rate = _run(status, clock, RATE_WINDOW_S - 1, 10.0)
    assert not warnings and math.isnan(rate)  # too short to tell, as after start
    warnings, rate = _run(status, clock, 3, 10.0)
    assert not warnings and abs(rate - 10) < 0.5


def test_a_camera_that_stops_while_the_node_runs_is_still_warned_about():
    clock = Clock()
    status = CameraStatus(["base"], ["/camera"], ("decode",), clock=clock)
    _run(status, clock, 4, 10.0)
    warnings, rate = _run(status, clock, 4, None)  # the node reads every second: not a stall
    assert rate == 0.0 and warnings and "below min_camera_rate_hz 5" in warnings[0]


def test_a_camera_that_comes_back_after_a_silence_is_measured_from_then_on():
    """A camera driver killed and restarted: the camera node warned of its silence while it
    lasted, and when it came back warned '2.0 frames/s ... below min_camera_rate_hz 5' for the
    silence still in its window, and of the state its restarted driver had not sent yet (an
    integrator's walkthrough). Back after a silence, a camera is measured as from its first frame;
    one that comes back slow is warned of once that is known."""
    clock = Clock()
    status = CameraStatus(["base"], ["/camera"], ("decode",), clock=clock)
    _run(status, clock, 5, 10.0)
    warnings, rate = _run(status, clock, 8, None)
    assert rate == 0.0 and warnings  # the silence, while it lasts
    status.frame(0)
    assert status.settling()  # a state missing now is its driver coming up, not a fault
    warnings, rate = _run(status, clock, RATE_WINDOW_S - 0.5, 10.0)
    assert not warnings and math.isnan(rate), warnings
    warnings, rate = _run(status, clock, 3, 10.0)
    assert not warnings and abs(rate - 10) < 0.5 and not status.settling()
    _run(status, clock, 5, None)
    warnings, rate = _run(status, clock, 8, 1.0)  # back, but slow
    assert warnings and "below min_camera_rate_hz 5" in warnings[-1], warnings


def test_a_missing_state_is_expected_while_the_node_settles():
    clock = Clock()
    status = CameraStatus(["base"], ["/camera"], ("decode",), clock=clock)
    assert status.settling()
    _run(status, clock, RATE_WINDOW_S + 0.5, 10.0)
    assert not status.settling()
    clock.now += 30.0  # the process stalls; the next reading starts the grace again
    _run(status, clock, 1, 10.0)
    assert status.settling()
    late = CameraStatus(["base"], ["/camera"], ("decode",), clock=clock)
    _run(late, clock, 10.0, None)  # nothing for 10 s: then a bag player starts, images before states
    assert not late.settling()
    late.frame(0)
    assert late.settling()


def test_a_node_that_reads_its_rates_less_often_is_not_taken_for_stalled():
    clock = Clock()
    status = CameraStatus(["base"], ["/camera"], ("decode",), clock=clock, reading_period=2.0)
    warnings, rate = _run(status, clock, 8, 10.0, every=20)
    assert not status.settling() and not warnings and abs(rate - 10) < 0.5


def test_a_camera_that_delivered_then_went_silent_past_max_age_makes_the_status_warn():
    from diagnostic_msgs.msg import DiagnosticStatus

    clock = Clock()
    status = CameraStatus(["base", "wrist"], ["/camera", "/wrist"], ("decode",), clock=clock)
    for _ in range(40):  # both at 10 Hz for 4 s
        clock.now += 0.1
        status.frame(0)
        status.frame(1)
    level, message = status.status(status.figures(""), max_age=0.5, min_rate_hz=0.0)
    assert level == DiagnosticStatus.OK, message
    for _ in range(20):  # the wrist camera stops for 2 s; the base camera goes on
        clock.now += 0.1
        status.frame(0)
    level, message = status.status(status.figures(""), max_age=0.5, min_rate_hz=0.0)
    assert level == DiagnosticStatus.WARN
    assert message == "no frame from wrist (2.0 s)"


def test_stale_groups_are_reported_as_those_dropped_since_the_last_status():
    from diagnostic_msgs.msg import DiagnosticStatus

    clock = Clock()
    status = CameraStatus(["base"], ["/camera"], ("decode",), clock=clock)
    status.frame(0)

    def read():
        return status.status(status.figures(""), max_age=10.0, min_rate_hz=0.0)

    status.dropped_stale += 3
    assert read() == (DiagnosticStatus.WARN, "3 stale groups dropped")
    status.dropped_stale += 2
    assert read() == (DiagnosticStatus.WARN, "2 stale groups dropped")
    level, message = read()  # none since: the node is fine again
    assert level == DiagnosticStatus.OK and "stale" not in message, message
    assert status.figures("")["dropped_stale"] == 5  # the figure itself stays the total


def test_the_group_stamp_spread_is_the_widest_since_the_last_figures():
    """How far apart a published group's frames were taken, the widest since the last reading;
    NaN when no group went out since (so a camera pair that drifted apart shows while it does)."""
    status = CameraStatus(["base", "wrist"], ["/a", "/b"], ("decode",), clock=Clock())
    assert math.isnan(status.figures("")["group_stamp_spread_ms"])
    status.group(3_000_000)
    status.group(100_000_000)
    status.group(0)
    figures = status.figures("")
    assert figures["group_stamp_spread_ms"] == 100.0 and figures["published"] == 3
    assert math.isnan(status.figures("")["group_stamp_spread_ms"])


def _frames(status, clock, seconds, period_ms=100, keep=lambda k: True, hold_ms=0):
    """A camera stamping its frames every ``period_ms`` for ``seconds``; only the frames ``keep``
    selects arrive (``hold_ms``: each arrival later by that much, as a lockstep player's hold
    moves a restamped stamp); the rates are read every second, as the node does."""
    warnings, stamp = [], 0
    for k in range(round(seconds * 1000 / period_ms)):
        clock.now += period_ms / 1000
        stamp += (period_ms + hold_ms) * 1_000_000
        if keep(k):
            status.frame(0, stamp, period_ms * 1_000_000)
        if math.floor(clock.now) > math.floor(clock.now - period_ms / 1000):  # each whole second
            status.figures("")
            warnings += status.rate_warnings(5.0)
    return warnings


#: Which frames of 30 arrive when best effort loses half a 30 Hz camera's large raw images (in gaps).
HALF_LOST = {0, 1, 4, 5, 6, 9, 12, 13, 16, 17, 18, 21, 23, 24, 28}


def test_frames_missing_by_their_stamps_are_counted_and_warned_about_above_a_tenth():
    """A 30 Hz camera losing half its frames (best effort and large raw images): its rate (15
    Hz) is above min_camera_rate_hz, but the stamps show the frames missing."""
    clock = Clock()
    status = CameraStatus(["base"], ["/camera"], ("decode",), clock=clock)
    lossy = lambda k: k % 30 in HALF_LOST  # noqa: E731
    assert _frames(status, clock, 2, period_ms=33, keep=lossy) == []  # settling: not warned
    assert _frames(status, clock, 4, period_ms=33) == []  # all there
    warnings = _frames(status, clock, 4, period_ms=33, keep=lossy)
    assert status.missing[0] >= 55 and status.figures("")["base.frames_missing"] == status.missing[0]
    (line,) = warnings  # throttled: one in 4 s
    assert "camera base on /camera:" in line and "frames missing by their stamps over the last 3 s" in line
    assert "below min_camera_rate_hz" not in line


def test_a_few_frames_missing_or_a_lockstep_hold_or_a_pause_warn_of_nothing():
    clock = Clock()
    status = CameraStatus(["base"], ["/camera"], ("decode",), clock=clock)
    assert _frames(status, clock, 6, keep=lambda k: k % 20 != 5) == []  # one in 20 (under a tenth)
    assert status.missing[0] == 3
    assert _frames(status, clock, 6, hold_ms=30) == []  # each frame held 30 ms: steps of 130 ms
    assert status.missing[0] == 3
    status.frame(0, 10**12, 100_000_000)  # the camera paused for minutes, then went on: not frames lost
    assert status.missing[0] == 3


def test_a_camera_whose_rate_was_lowered_is_not_taken_for_one_losing_frames():
    """A camera set from 10 Hz to 1 Hz steps ten of its old periods, frame after frame, until
    its period is learnt anew (the node passes its grouping's period of its last 8 steps): no
    frame is missing, and nothing is warned about. Set back to 10 Hz, a gap of three periods is
    two frames missing."""
    clock = Clock()
    status = CameraStatus(["base"], ["/camera"], ("decode",), clock=clock)
    assert _frames(status, clock, 5) == []  # settled, 10 Hz
    steps, stamp, warnings = deque([100_000_000] * 8, maxlen=8), 5 * 10**9, []
    for step_s in [1.0] * 12 + [0.1] * 10 + [0.3, 0.1, 0.1]:
        clock.now += step_s
        stamp += round(step_s * 1e9)
        status.frame(0, stamp, typical_period_ns(steps))
        steps.append(round(step_s * 1e9))
        status.figures("")
        warnings += status.rate_warnings(0.5)
    assert status.missing[0] == 2 and warnings == []


def _stamped(status, clock, stamps_s, every=None):
    """Frames of camera 0 stamped ``stamps_s`` (seconds), each arriving at its stamp; the period
    passed as the node passes it (its grouping's, of the last 8 steps). ``every``: frames kept."""
    steps, previous = deque(maxlen=PERIOD_STEPS), None
    for i, stamp_s in enumerate(stamps_s):
        stamp = round(stamp_s * 1e9)
        clock.now = 100.0 + stamp_s
        if every is None or every(i):
            status.frame(0, stamp, typical_period_ns(steps))
            if previous is not None:
                steps.append(stamp - previous)
            previous = stamp


def test_a_publisher_whose_stamps_jitter_or_run_late_loses_no_frame_by_the_count():
    """A 30 Hz publisher stamping when it gets to it: every frame arrives, but 5 ms of jitter
    made its shortest step a quarter short of its period (15 of 900 counted missing), and a
    frame published 30 ms late once a second, then the next on time, counted 30."""
    import numpy as np

    rng = np.random.default_rng(7)
    jittery = [i / 30 + abs(rng.normal(0, 0.005)) for i in range(900)]
    late = [i / 30 + (0.030 if i % 30 == 5 else 0.0) for i in range(900)]
    for stamps in (jittery, late):
        clock = Clock()
        status = CameraStatus(["base"], ["/camera"], ("decode",), clock=clock)
        _stamped(status, clock, stamps)
        assert status.missing[0] <= 1, status.missing[0]
    clock = Clock()  # the same jittery publisher losing one frame in ten: most are counted (a gap
    status = CameraStatus(["base"], ["/camera"], ("decode",), clock=clock)  # jittered off 2 periods is not)
    _stamped(status, clock, jittery, every=lambda i: i % 10 != 3)
    assert 70 <= status.missing[0] <= 90, status.missing[0]
