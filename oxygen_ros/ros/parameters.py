"""One parameter system for every node: a spec per parameter, checked at start and on every change.

A :class:`ParamSpec` names a parameter, its type, default, description, its
own check and whether it may change while the node runs. :func:`coerce`
enforces the type and runs the check; :func:`declare_parameters` declares a
node's table and returns the checked values; :func:`parameter_callback` is the
on-set-parameters callback that puts a run-time change through the very same
:func:`coerce`. Every error is a :class:`ParameterError` naming the parameter.

A check is called as ``check(value, values)``: ``values`` holds the other
parameters' current values (for a relation such as ``steps_per_frame <=
max_decode``); it returns None when the value is good, else the reason.
ROS-light: needs ``rclpy`` only to declare parameters and validate topic names.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.exceptions import NameValidationException
from rclpy.parameter import Parameter
from rclpy.validate_topic_name import validate_topic_name

from .params_files import NodeStart, read_files, section_warnings, shared_only
from .params_sections import QOS_OVERRIDES

#: Parameter types and how an error message names them.
TYPES = {"str": "a string", "str_list": "a list of strings", "int": "an integer",
         "float": "a finite number", "bool": "a boolean"}

Check = Callable[[Any, Optional[Mapping]], Optional[str]]


class ParameterError(ValueError):
    """A parameter has a bad value; the message names the parameter. ``node``: the node whose it
    is, where the raiser knows it and the message does not say (one command starting several)."""

    node: str = ""

    def __init__(self, name: str, reason: str):
        super().__init__(f"parameter '{name}': {reason}")
        self.name = name
        self.reason = reason


class ParameterErrors(ParameterError):
    """Several parameters have bad values: ``errors``, each a :class:`ParameterError`, in the
    table's order (its ``name`` and ``reason`` are the first's). The message names every one,
    so that a params file with several mistakes is mended in one go."""

    def __init__(self, errors: Sequence[ParameterError]):
        ValueError.__init__(self, f"{len(errors)} bad parameters: " + "; ".join(str(e) for e in errors))
        self.errors = list(errors)
        self.name = errors[0].name
        self.reason = errors[0].reason


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: default, description, type, its check, run-time changeable."""

    name: str
    default: Any
    description: str
    type: str  # one of TYPES
    check: Check | None = None  # returns a reason when the value is bad
    dynamic: bool = False  # may be changed at run time (else read-only)
    constraints: str = ""  # shown by `ros2 param describe`
    #: (for false, for true): a string parameter whose values include on/off reads the booleans
    #: that YAML (a params file, ``name:=on`` on a command line) makes of them as these strings
    bool_as: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"parameter {self.name}: type must be one of {', '.join(TYPES)}, got {self.type!r}")
        if not self.constraints and self.check is not None:  # what `ros2 param describe` shows: a shared check's
            object.__setattr__(self, "constraints", CHECK_CONSTRAINTS.get(self.check, ""))


def coerce(spec: ParamSpec, value: Any, values: Mapping | None = None) -> Any:
    """The value converted to the spec's type and checked, or :class:`ParameterError`.

    Parameters are declared with dynamic typing so that ``[]`` (typed
    BYTE_ARRAY by rclpy) and ``1`` for a float are accepted; the types are
    enforced here instead. ``values``: the other parameters, for relations.
    """
    kind = spec.type
    if kind == "str_list" and (value is None or (isinstance(value, (list, tuple)) and len(value) == 0)):
        value = []
    if kind == "str" and isinstance(value, bool) and spec.bool_as is not None:
        value = spec.bool_as[value]
    if kind == "str":
        ok = isinstance(value, str)
    elif kind == "str_list":
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        value = list(value) if ok else value
    elif kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, bool)
    if not ok:
        raise ParameterError(spec.name, f"must be {TYPES[kind]}, got {value!r} ({type(value).__name__})")
    if spec.check is not None and (reason := spec.check(value, values)) is not None:
        raise ParameterError(spec.name, reason)
    return value


def check_all(specs: Iterable[ParamSpec], raw: Mapping[str, Any]) -> dict[str, Any]:
    """Every value of ``raw`` (by spec) coerced and checked, relations against the others.
    Every bad one is found: one raises its :class:`ParameterError`, several a :class:`ParameterErrors`.
    A value refused only for its relation to another bad value is not told (``steps_per_frame``
    is not said to exceed a ``max_decode`` of 0 that is itself refused)."""
    specs = list(specs)
    values, errors = {}, []
    for spec in specs:
        try:
            values[spec.name] = coerce(spec, raw[spec.name], raw)
        except ParameterError as exc:
            errors.append(exc)
    refused = {e.name for e in errors}
    good = {name: value for name, value in raw.items() if name not in refused}
    table = {s.name: s for s in specs}
    # two values refused only for each other (steps_per_frame 0, decode_when_idle false) are both told
    errors = [e for e in errors if not _good_beside(table[e.name], raw[e.name], good)] or errors
    if len(errors) > 1:
        raise ParameterErrors(errors)
    if errors:
        raise errors[0]
    return values


def _good_beside(spec: ParamSpec, value: Any, good: Mapping[str, Any]) -> bool:
    """Whether ``value`` passes its check against the good values alone (its refusal was a relation)."""
    try:
        coerce(spec, value, good)
    except ParameterError:
        return False
    return True


def _descriptor(spec: ParamSpec, read_only: bool, configurable: bool = False) -> ParameterDescriptor:
    when = "" if spec.dynamic else " (read at configure: can change while unconfigured)" if configurable else \
        " (read at start)"
    return ParameterDescriptor(description=spec.description + when, additional_constraints=spec.constraints,
                               dynamic_typing=True, read_only=read_only)


#: Parameters rclpy declares on every node, and the QoS overrides rclpy reads itself.
IMPLICIT_PARAMETERS = ("use_sim_time", "start_type_description_service")


def unknown_parameters(node, specs: Iterable[ParamSpec], elsewhere: Mapping[str, Iterable[ParamSpec]] | None = None,
                       shared: Collection[str] = ()) -> list[str]:
    """What ``node`` was given (its params files' sections, overrides) that is none of its
    parameters: each with the node of ``elsewhere`` ({node name: its specs}; default: every node
    of this package) it belongs to, else the known name it is closest to, its own or another
    node's (a typo in the YAML would otherwise leave that parameter at its default, unnoticed). Another node's
    parameter that came from ``shared`` sections only (``/**``: they hold every node's,
    :func:`.params_files.shared_only`) is left out. Warned, not refused."""
    known = [s.name for s in specs]
    given = getattr(node, "_parameter_overrides", {})
    names = sorted(n for n in given if n not in known and n not in IMPLICIT_PARAMETERS
                   and not n.startswith(QOS_OVERRIDES))
    if names and elsewhere is None:
        from .params_files import package_tables  # on demand: the inference node's table brings torch

        elsewhere = package_tables()
    owners: dict[str, list[str]] = {}
    for owner, other in (elsewhere or {}).items():
        for spec in other:
            owners.setdefault(spec.name, []).append(owner)
    out = []
    for name in names:
        if name in owners:
            if name not in shared:
                whose, where = " and ".join(owners[name]), "its section" if len(owners[name]) == 1 else "their sections"
                out.append(f"{name!r} (a parameter of {whose}: in {where})")
        elif close := difflib.get_close_matches(name, known + [n for n in owners if n not in known], n=1):
            whose = "" if close[0] in known else f", a parameter of {' and '.join(owners[close[0]])}"
            out.append(f"{name!r} (did you mean {close[0]!r}{whose}?)")
        else:
            out.append(repr(name))
    return out


def warn_given(node, specs: Iterable[ParamSpec], elsewhere: Mapping[str, Iterable[ParamSpec]] | None = None,
               start: NodeStart | None = None) -> None:
    """Warn in ``node``'s log of the sections of its params files that it does not get though they
    name it (:func:`.params_files.section_warnings`; ``start``: what it was started with, None:
    no file is read) and of the parameters it was given that are none of ``specs``
    (:func:`unknown_parameters`)."""
    files = read_files(start.arguments) if start is not None else []
    fqn = node.get_fully_qualified_name()
    for line in section_warnings(files, fqn, start.name, getattr(node, "_parameter_overrides", {})) if files else ():
        node.get_logger().warning(line)
    unknown = unknown_parameters(node, specs, elsewhere, shared_only(files, fqn))
    if unknown:
        node.get_logger().warning(f"unknown parameter(s) ignored: {', '.join(unknown)} (this node's parameters: "
                                  "config/agent.yaml, `ros2 param list`)")


def declare_parameters(node, specs: Iterable[ParamSpec], elsewhere: Mapping[str, Iterable[ParamSpec]] | None = None,
                       configurable: Collection[str] = (), start: NodeStart | None = None) -> dict[str, Any]:
    """Declare every parameter on ``node``; return their checked values (or raise ParameterError).
    What its params files (read from ``start``) give it wrongly is warned of in its log
    (:func:`warn_given`): sections naming it that it does not get, and parameters that are none
    of ``specs``, naming each, and the node of ``elsewhere`` whose parameter it is.
    The parameters read at start are read-only but for those named in ``configurable`` (a
    lifecycle node's, read at configure: its :func:`parameter_callback` takes their changes while
    it is unconfigured).

    An empty list of strings is stored as an empty STRING_ARRAY. rclpy would store it
    untyped: a default ``[]`` becomes a BYTE_ARRAY, and ``name: []`` in a params file
    leaves the parameter NOT_SET, which the parameter services cannot answer for
    (``ros2 param dump`` then gets nothing, or writes ``null``, which does not load
    back). Such a parameter is declared writable, given its typed empty value, and
    then made read-only if its spec says so. A whole number given for a float is
    stored as that float, at start and on every later change (:func:`numbers_as_declared`)."""
    raw = {}
    specs = list(specs)
    as_declared = numbers_as_declared(specs)
    for spec in specs:
        param = node.declare_parameter(spec.name, spec.default, _descriptor(spec, read_only=False))
        if spec.type == "str_list" and param.type_ != Parameter.Type.STRING_ARRAY and not param.value:
            node.set_parameters([Parameter(spec.name, Parameter.Type.STRING_ARRAY, [])])
            param = node.get_parameter(spec.name)
        (typed,) = as_declared([param])
        if typed is not param:  # `50` given for a float: stored as 50.0
            node.set_parameters([typed])
            param = node.get_parameter(spec.name)
        if spec.name in configurable and not spec.dynamic:
            node.set_descriptor(spec.name, _descriptor(spec, read_only=False, configurable=True))
        elif not spec.dynamic:
            node.set_descriptor(spec.name, _descriptor(spec, read_only=True))
        raw[spec.name] = param.value
    node.add_pre_set_parameters_callback(as_declared)
    warn_given(node, specs, elsewhere, start)
    return check_all(specs, raw)


def numbers_as_declared(specs: Iterable[ParamSpec]) -> Callable[[list], list]:
    """A pre-set-parameters callback: a whole number set for a float parameter (``ros2 param
    set ... control_rate_hz 25``, ``control_rate_hz:=25``, ``control_rate_hz: 25`` in YAML) is
    stored as that float, so that ``ros2 param get`` and ``dump`` show the parameter's type."""
    floats = {s.name for s in specs if s.type == "float"}

    def callback(params: list) -> list:
        return [Parameter(p.name, Parameter.Type.DOUBLE, float(p.value))
                if p.name in floats and p.type_ == Parameter.Type.INTEGER else p for p in params]

    return callback


def declare_parameters_or_fail(node, specs: Iterable[ParamSpec], start: NodeStart | None = None) -> dict[str, Any]:
    """:func:`declare_parameters`; on a :class:`ParameterError` the node logs it as fatal, is destroyed,
    and the error is raised (a node that cannot start says why and leaves nothing behind)."""
    try:
        return declare_parameters(node, specs, start=start)
    except ParameterError as exc:
        node.get_logger().fatal(str(exc))
        node.destroy_node()
        raise


# ---------------------------------------------------------------------- checks
def positive(value: float, values: Mapping | None = None) -> str | None:
    return None if value > 0 else f"must be > 0, got {value}"


def non_negative(value: float, values: Mapping | None = None) -> str | None:
    return None if value >= 0 else f"must be >= 0, got {value}"


def at_least_one(value: int, values: Mapping | None = None) -> str | None:
    return None if value >= 1 else f"must be >= 1, got {value}"


def in_range(low: float, high: float, unit: str = "") -> Check:
    """A check: ``low <= value <= high``."""
    def check(value, values=None):
        return None if low <= value <= high else f"must be in {low:g}..{high:g}{unit}, got {value!r}"
    return check


def one_of(choices: Iterable[str]) -> Check:
    """A check: the value is one of ``choices``."""
    choices = tuple(choices)

    def check(value, values=None):
        return None if value in choices else f"must be one of {', '.join(choices)}, got {value!r}"
    return check


def topic_name(value: str, values: Mapping | None = None) -> str | None:
    if not value:
        return "must be a topic name, got ''"
    try:
        validate_topic_name(value)
    except NameValidationException as exc:
        return f"{value!r} is not a valid topic name: {exc}"
    return None


def optional_topic_name(value: str, values: Mapping | None = None) -> str | None:
    return None if value == "" else topic_name(value)


def topic_list(value: list[str], values: Mapping | None = None) -> str | None:
    for name in value:
        if (reason := topic_name(name)) is not None:
            return reason
    if len(set(value)) != len(value):
        return f"topics are listed twice in {value}"
    return None


#: the constraints a parameter with one of these checks (and none of its own) describes
CHECK_CONSTRAINTS: dict[Callable, str] = {
    positive: "> 0", non_negative: ">= 0", at_least_one: ">= 1", topic_name: "a topic name",
    optional_topic_name: "a topic name, or empty: none", topic_list: "topic names, each once",
}


def unique_names(value: list[str], values: Mapping | None = None) -> str | None:
    if not all(value):
        return f"names must be non-empty, got {value!r}"
    return None if len(set(value)) == len(value) else f"names must be unique, got {value!r}"
