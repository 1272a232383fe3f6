"""Run inside every Python kernel at start (IPKernelApp.exec_files): the MIME types E2B's
kernels add to a display — `e2b/chart` for a matplotlib figure (the SDK's `Result.chart`:
line, scatter, bar, pie, several axes as a superchart) and `e2b/data` for a pandas
DataFrame (`Result.data`, columns as lists).

Registered by type *name*, so nothing heavy is imported at kernel start: the formatters
apply once the user's code has imported matplotlib or pandas. Self-contained (the kernel's
sys.path does not hold this package); its functions are also imported by the tests.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DATA_CELLS = 1_000_000  # a DataFrame larger than this is not repeated as e2b/data
_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def _num(v: Any) -> Any:
    """A JSON-safe scalar: numbers as float (NaN/inf as None), anything else as text."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if isinstance(v, str):
        return v
    return f if math.isfinite(f) else None


def _unit(label: str | None) -> str | None:
    m = _UNIT.search(label or "")
    return (m.group(1) or m.group(2)) if m else None


def _scale(ax: Any, which: str) -> str:
    axis = ax.xaxis if which == "x" else ax.yaxis
    conv = axis.get_converter() if hasattr(axis, "get_converter") else axis.converter
    name = type(conv).__name__.lower() if conv is not None else ""
    if "categor" in name:
        return "categorical"
    if "date" in name:
        return "datetime"
    return str(ax.get_xscale() if which == "x" else ax.get_yscale())


def _base(ax: Any) -> dict[str, Any]:
    return {"title": ax.get_title() or None}


def _two_d(ax: Any) -> dict[str, Any]:
    x_label, y_label = ax.get_xlabel() or None, ax.get_ylabel() or None
    return {
        **_base(ax),
        "x_label": x_label,
        "y_label": y_label,
        "x_unit": _unit(x_label),
        "y_unit": _unit(y_label),
    }


def _ticks(ax: Any) -> dict[str, Any]:
    return {
        "x_ticks": [_num(t) for t in ax.get_xticks()],
        "x_tick_labels": [t.get_text() for t in ax.get_xticklabels()],
        "x_scale": _scale(ax, "x"),
        "y_ticks": [_num(t) for t in ax.get_yticks()],
        "y_tick_labels": [t.get_text() for t in ax.get_yticklabels()],
        "y_scale": _scale(ax, "y"),
    }


def _label_at(positions: list[float], labels: list[str], at: float) -> str:
    if not positions:
        return ""
    i = min(range(len(positions)), key=lambda k: abs(positions[k] - at))
    return labels[i] if i < len(labels) else ""


def chart_of_axes(ax: Any) -> dict[str, Any]:
    """The chart one Axes shows, in the shape the SDK's `_deserialize_chart` reads."""
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if bars:
        horizontal = getattr(bars[0], "orientation", "vertical") == "horizontal"
        axis_ticks = ax.get_yticks() if horizontal else ax.get_xticks()
        axis_labels = ax.get_yticklabels() if horizontal else ax.get_xticklabels()
        pos = [float(t) for t in axis_ticks]
        names = [t.get_text() for t in axis_labels]
        elements = []
        for container in bars:
            group = container.get_label()
            group = "" if not group or group.startswith("_") else group
            for rect in container:
                if horizontal:
                    at, value = rect.get_y() + rect.get_height() / 2, rect.get_width()
                else:
                    at, value = rect.get_x() + rect.get_width() / 2, rect.get_height()
                elements.append(
                    {"label": _label_at(pos, names, at), "value": _num(value), "group": group}
                )
        chart = {"type": "bar", **_two_d(ax), "elements": elements}
        if horizontal:  # the value axis is x: swap so y is always the value's
            chart["x_label"], chart["y_label"] = chart["y_label"], chart["x_label"]
            chart["x_unit"], chart["y_unit"] = chart["y_unit"], chart["x_unit"]
        return chart
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges and len(wedges) == len(ax.patches):
        return {
            "type": "pie",
            **_base(ax),
            "elements": [
                {
                    "label": w.get_label(),
                    "angle": abs(round(w.theta2 - w.theta1, 4)),
                    "radius": _num(w.r),
                }
                for w in wedges
            ],
        }
    if ax.lines and not ax.collections and not ax.patches:
        return {
            "type": "line",
            **_two_d(ax),
            **_ticks(ax),
            "elements": [
                {
                    "label": line.get_label(),
                    "points": [
                        [_num(x), _num(y)]
                        for x, y in zip(line.get_xdata(), line.get_ydata(), strict=False)
                    ],
                }
                for line in ax.lines
            ],
        }
    if ax.collections and not ax.lines and not ax.patches:
        return {
            "type": "scatter",
            **_two_d(ax),
            **_ticks(ax),
            "elements": [
                {"label": c.get_label(), "points": [[_num(x), _num(y)] for x, y in c.get_offsets()]}
                for c in ax.collections
            ],
        }
    return {"type": "unknown", **_base(ax), "elements": []}


def chart_of_figure(fig: Any) -> dict[str, Any] | None:
    axes = fig.get_axes()
    if not axes:
        return None
    if len(axes) == 1:
        return chart_of_axes(axes[0])
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else None
    return {
        "type": "superchart",
        "title": title or None,
        "elements": [chart_of_axes(ax) for ax in axes],
    }


def data_of_frame(df: Any) -> dict[str, Any] | None:
    """A DataFrame as {column: [values]} (E2B's `e2b/data`), JSON-safe."""
    if df.size > MAX_DATA_CELLS:
        return None
    return {
        str(col): json.loads(df[col].to_json(orient="values", date_format="iso"))
        for col in df.columns
    }


def _is(obj: Any, names: tuple[str, ...]) -> bool:
    """Whether `obj` is an instance of a class named `names` (module.Class), without
    importing that module."""
    return any(f"{c.__module__}.{c.__name__}" in names for c in type(obj).__mro__)


_FIGURE = ("matplotlib.figure.Figure",)
_FRAME = ("pandas.core.frame.DataFrame", "pandas.DataFrame")


def install(ip: Any) -> None:
    """Add the two formatters to an IPython shell's display formatter.

    They match in `__call__` rather than through the type registry: enabling the inline
    backend removes every formatter's entry for Figure (IPython's select_figure_formats),
    and pandas 2+ names its DataFrame's module `pandas`, 1.x `pandas.core.frame`.
    """
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    def formatter(mime: str, names: tuple[str, ...], fn: Any) -> Any:
        class E2BFormatter(BaseFormatter):
            format_type = Unicode(mime)
            print_method = ObjectName("_repr_aenv_none_")
            _return_type = (dict,)

            def __call__(self, obj: Any) -> Any:
                if not self.enabled or not _is(obj, names):
                    return None
                try:
                    return fn(obj)
                except Exception:  # a chart we cannot read must never break the display
                    return None

        return E2BFormatter

    display = ip.display_formatter
    for mime, names, fn in (
        ("e2b/chart", _FIGURE, chart_of_figure),
        ("e2b/data", _FRAME, data_of_frame),
    ):
        display.formatters[mime] = formatter(mime, names, fn)(parent=display)
        if display.active_types and mime not in display.active_types:
            display.active_types = [*display.active_types, mime]


def _main() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is not None:
        install(ip)


_main()
