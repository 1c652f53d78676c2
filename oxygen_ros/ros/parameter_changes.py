"""Run-time parameter changes of the package's nodes: each checked as at start (:func:`parameter_callback`,
installed by :func:`check_parameter_changes`, which warns of a refused one in the node's log), the values
taken (:func:`changed_values`) and the line that says what changed (:func:`log_changes`)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from rcl_interfaces.msg import SetParametersResult

from .parameters import ParameterError, ParamSpec, coerce


def parameter_callback(specs: Sequence[ParamSpec], current: Callable[[], Mapping] | None = None,
                       configurable: Collection[str] = (), unconfigured: Callable[[], bool] = lambda: False,
                       sim_time: Callable[[], Any] | None = None) -> Callable[[list], SetParametersResult]:
    """An on-set-parameters callback putting each change through :func:`coerce`.
    ``current()``: the node's values now, for relations (a change is checked
    against the others changed with it). The parameters read at start that are named in
    ``configurable`` change only while ``unconfigured()`` (the refusal says how to get there);
    their value as it is is taken at any time (``ros2 param load`` of the node's own dump).
    ``sim_time()``: the node's ``use_sim_time``, then refused at run time, unless unchanged: rclpy
    would switch the node's clock, and its timers would wait for a ``/clock`` that may not come."""
    table = {s.name: s for s in specs}

    def callback(params: list) -> SetParametersResult:
        now = dict(current()) if current is not None else {}
        values = {**now, **{p.name: p.value for p in params if p.name in table}}
        for param in params:
            spec = table.get(param.name)
            if spec is None:
                if param.name == "use_sim_time" and sim_time is not None and param.value != sim_time():
                    return SetParametersResult(successful=False, reason=(
                        "'use_sim_time' is read at start: the node's clock and timers follow it (set it when the "
                        "node starts: -p use_sim_time:=true, its params file, or the launch's)"))
                continue
            try:
                if not spec.dynamic and spec.name not in configurable:  # read-only: rclpy refuses them first
                    raise ParameterError(param.name, "cannot change while running")
                value = coerce(spec, param.value, values)
                if not spec.dynamic and not unconfigured() and not (param.name in now and value == now[param.name]):
                    raise ParameterError(param.name, "is read at configure: it changes only while the node is "
                                                     "unconfigured (deactivate, cleanup, set it, configure)")
            except ParameterError as exc:
                return SetParametersResult(successful=False, reason=str(exc))
        return SetParametersResult(successful=True)

    return callback


def check_parameter_changes(node, specs: Sequence[ParamSpec], current: Callable[[], Mapping] | None = None,
                            configurable: Collection[str] = (),
                            unconfigured: Callable[[], bool] = lambda: False) -> None:
    """Put every run-time change of ``node``'s parameters through :func:`parameter_callback`,
    its ``use_sim_time`` included."""
    check = parameter_callback(specs, current, configurable, unconfigured,
                               sim_time=lambda: node.get_parameter("use_sim_time").value)

    def logged(params: list) -> SetParametersResult:
        result = check(params)
        if not result.successful:  # the caller gets the reason; the node's log says it too
            node.get_logger().warning(f"parameter change refused: {result.reason}")
        return result

    node.add_on_set_parameters_callback(logged)


def changed_values(specs: Sequence[ParamSpec], params: list, configurable: Collection[str] = ()) -> dict[str, Any]:
    """The dynamic parameters of ``params`` (accepted by the callback), and those of
    ``configurable``, coerced."""
    table = {s.name: s for s in specs}
    return {p.name: coerce(table[p.name], p.value) for p in params
            if p.name in table and (table[p.name].dynamic or p.name in configurable)}


def log_changes(node, changes: Mapping[str, Any], when: str = "", before: Mapping[str, Any] | None = None) -> None:
    """One info line naming the run-time changes a node took, each ``name=new`` or, with its value
    ``before``, ``name: old -> new`` (nothing when there are none)."""
    def shown(value: Any) -> str:
        return repr(value) if isinstance(value, str) else str(value)

    if changes:
        node.get_logger().info(f"parameters changed{when}: " + ", ".join(
            f"{k}: {shown(before[k])} -> {shown(v)}" if before is not None and k in before else f"{k}={shown(v)}"
            for k, v in changes.items()))
