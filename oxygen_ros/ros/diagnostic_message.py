"""The /diagnostics message the nodes publish: one status carrying every figure."""

from __future__ import annotations

import math
from typing import Any

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue


def format_value(v: Any) -> str:
    """A diagnostics value as a KeyValue string."""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.3f}"
    return str(v)


def diagnostic_array(name: str, hardware_id: str, status: tuple, figures: dict, stamp: Time) -> DiagnosticArray:
    """The /diagnostics message: one status (``status`` = (level, message)) carrying every figure."""
    level, message = status
    values = [KeyValue(key=k, value=format_value(v)) for k, v in figures.items()]
    array = DiagnosticArray(status=[DiagnosticStatus(level=level, name=name, message=message,
                                                     hardware_id=hardware_id, values=values)])
    array.header.stamp = stamp
    return array
