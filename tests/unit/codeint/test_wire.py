"""The lines `/execute` streams, read back by E2B's own parser (e2b_code_interpreter's
`parse_output`): what our server maps from Jupyter messages is what the SDK understands."""

from __future__ import annotations

import json

from e2b_code_interpreter.models import Execution, parse_output

from codeint import wire


def parsed(*lines: dict[str, object]) -> Execution:
    execution = Execution()
    for item in lines:
        parse_output(execution, wire.line(item).decode())
    return execution


def test_every_mime_type_lands_in_its_field() -> None:
    bundle = {
        "text/plain": "'abc'",
        "text/html": "<b>",
        "text/markdown": "*m*",
        "image/svg+xml": "<svg/>",
        "image/png": "iVBO",
        "image/jpeg": "/9j/",
        "application/pdf": "JVBE",
        "text/latex": "$x$",
        "application/json": {"a": 1},
        "application/javascript": "alert(1)",
        "e2b/data": {"a": [1]},
        "application/x-custom": "z",
    }
    line = wire.from_jupyter("execute_result", {"data": bundle})
    assert line is not None
    r = parsed(line).results[0]
    assert r.is_main_result and r.text == "abc"  # IPython's quotes stripped, as E2B's server
    assert (r.html, r.markdown, r.svg, r.png, r.jpeg, r.pdf, r.latex) == (
        "<b>",
        "*m*",
        "<svg/>",
        "iVBO",
        "/9j/",
        "JVBE",
        "$x$",
    )
    assert r.json == {"a": 1} and r.javascript == "alert(1)" and r.data == {"a": [1]}
    assert r.extra == {"application/x-custom": "z"}


def test_display_data_is_not_the_main_result() -> None:
    line = wire.from_jupyter("display_data", {"data": {"image/png": "x", "text/plain": "<F>"}})
    assert line is not None
    r = parsed(line).results[0]
    assert not r.is_main_result and r.png == "x"
    assert parsed(line).text is None  # Execution.text is the main result's only


def test_streams_errors_and_counts() -> None:
    lines = [
        wire.from_jupyter("execute_input", {"execution_count": 7}),
        wire.from_jupyter("stream", {"name": "stdout", "text": "a\n"}, 5),
        wire.from_jupyter("stream", {"name": "stderr", "text": "b\n"}),
        wire.from_jupyter(
            "error", {"ename": "ValueError", "evalue": "bad", "traceback": ["line 1", "line 2"]}
        ),
    ]
    out = []
    execution = Execution()
    for item in lines:
        assert item is not None
        parse_output(
            execution, wire.line(item).decode(), on_stdout=out.append, on_stderr=out.append
        )
    assert execution.execution_count == 7
    assert execution.logs.stdout == ["a\n"] and execution.logs.stderr == ["b\n"]
    assert out[0].timestamp == 5 and out[1].error
    assert execution.error is not None
    assert (execution.error.name, execution.error.value) == ("ValueError", "bad")
    assert execution.error.traceback == "line 1\nline 2"


def test_messages_without_a_line() -> None:
    assert wire.from_jupyter("status", {"execution_state": "busy"}) is None
    assert wire.from_jupyter("clear_output", {}) is None


def test_languages() -> None:
    assert wire.normalize_language(None) == "python"
    assert wire.normalize_language(" Python3 ") == "python"
    assert wire.normalize_language("sh") == "bash"
    assert wire.normalize_language("r") == "r"  # refused by the caller


def test_a_line_is_one_json_line() -> None:
    raw = wire.line(wire.stream("stdout", "x\ny", 1))
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    assert json.loads(raw) == {"type": "stdout", "text": "x\ny", "timestamp": 1}
