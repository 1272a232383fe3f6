"""Chart extraction (`e2b/chart`) from real matplotlib figures, read back by the SDK's own
chart classes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import pytest
from e2b_code_interpreter.charts import (
    BarChart,
    ChartType,
    LineChart,
    PieChart,
    ScatterChart,
    SuperChart,
    _deserialize_chart,
)

from codeint.kernel_startup import chart_of_figure, data_of_frame


@pytest.fixture(autouse=True)
def _close() -> None:
    plt.close("all")


def test_line_chart() -> None:
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1, 4, 9], label="squares")
    ax.set_title("Growth")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("size [m]")
    chart = _deserialize_chart(chart_of_figure(fig))
    assert isinstance(chart, LineChart) and chart.type == ChartType.LINE
    assert chart.title == "Growth" and chart.x_unit == "s" and chart.y_unit == "m"
    assert chart.elements[0].label == "squares"
    assert chart.elements[0].points == [(1.0, 1.0), (2.0, 4.0), (3.0, 9.0)]
    assert chart.x_scale.value == "linear"


def test_bar_chart_with_categories() -> None:
    fig, ax = plt.subplots()
    ax.bar(["apples", "pears"], [3, 5], label="fruit")
    chart = _deserialize_chart(chart_of_figure(fig))
    assert isinstance(chart, BarChart)
    assert [(e.label, e.value, e.group) for e in chart.elements] == [
        ("apples", 3.0, "fruit"),
        ("pears", 5.0, "fruit"),
    ]


def test_scatter_pie_and_several_axes() -> None:
    fig, ax = plt.subplots()
    ax.scatter([1, 2], [3, 4], label="pts")
    scatter = _deserialize_chart(chart_of_figure(fig))
    assert isinstance(scatter, ScatterChart) and scatter.elements[0].points == [(1, 3), (2, 4)]
    fig, ax = plt.subplots()
    ax.pie([1, 3], labels=["a", "b"])
    pie = _deserialize_chart(chart_of_figure(fig))
    assert isinstance(pie, PieChart)
    assert [(e.label, round(e.angle)) for e in pie.elements] == [("a", 90), ("b", 270)]
    fig, (a1, a2) = plt.subplots(1, 2)
    a1.plot([1, 2])
    a2.bar(["x"], [1])
    fig.suptitle("both")
    sup = _deserialize_chart(chart_of_figure(fig))
    assert isinstance(sup, SuperChart) and sup.title == "both"
    assert [type(c) for c in sup.elements] == [LineChart, BarChart]


def test_dataframe_as_columns() -> None:
    df = pd.DataFrame({"a": [1, 2], "b": ["x", None], "t": pd.to_datetime(["2024-01-01"] * 2)})
    data = data_of_frame(df)
    assert data is not None
    assert data["a"] == [1, 2] and data["b"] == ["x", None]
    assert data["t"][0].startswith("2024-01-01")
