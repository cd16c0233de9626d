"""Method-vs-baseline markdown tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def format_value(value: Any, digits: int = 3) -> str:
    """A metric cell: numbers to ``digits`` significant places, ``{"mean", "ci"}`` dicts as
    ``mean [lo, hi]``, anything else as text."""
    if isinstance(value, Mapping) and "mean" in value:
        text = format_value(value["mean"], digits)
        if value.get("ci") is not None:
            lo, hi = value["ci"]
            text += f" [{format_value(lo, digits)}, {format_value(hi, digits)}]"
        return text
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def markdown_table(
    metrics: Mapping[str, Mapping[str, Any]],
    columns: Sequence[str] | None = None,
    digits: int = 3,
) -> str:
    """One row per method (in the mapping's order), one column per metric.

    ``columns`` picks and orders the metrics; by default every metric any method reports,
    in first-seen order. Missing cells read ``-``.
    """
    if columns is None:
        columns = list(dict.fromkeys(k for row in metrics.values() for k in row))
    header = "| method | " + " | ".join(columns) + " |"
    rule = "|---|" + "---|" * len(columns)
    rows = [
        f"| {method} | "
        + " | ".join(format_value(row[c], digits) if c in row else "-" for c in columns)
        + " |"
        for method, row in metrics.items()
    ]
    return "\n".join([header, rule, *rows])
