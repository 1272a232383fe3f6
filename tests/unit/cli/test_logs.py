"""One JSON format for every process's log (issue 20): a record is one line whatever its
message holds, with the trace and the sandbox it belongs to; foreign lines are wrapped; the
stack's log file is JSON throughout and rotates."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

from aenv import logs
from aenv.logformat import PROGRESS, marks, message_of, progress, wrap
from bus import logcontext


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, sys.excepthook)
    logs.configure("aenv-test", level="DEBUG")
    try:
        yield out
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
        sys.excepthook = saved[2]
        logging.captureWarnings(False)


def _records(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_message_with_quotes_and_newlines_is_one_json_line(captured: io.StringIO) -> None:
    logging.getLogger("t").info('migration "0008":\nline two\n{"forged": 1}')
    (rec,) = _records(captured)
    assert rec["msg"] == 'migration "0008":\nline two\n{"forged": 1}'
    assert rec["level"] == "INFO" and rec["logger"] == "t" and rec["service"] == "aenv-test"
    assert str(rec["ts"]).endswith("+00:00")


def test_a_traceback_is_a_field_of_its_line(captured: io.StringIO) -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("t").exception("it failed")
    (rec,) = _records(captured)
    assert rec["msg"] == "it failed"
    assert "Traceback" in str(rec["exc_info"]) and "ValueError: boom" in str(rec["exc_info"])


def test_lines_carry_the_current_trace_and_the_bound_sandbox(captured: io.StringIO) -> None:
    tracer = TracerProvider().get_tracer("t")
    log = logging.getLogger("t")
    log.info("outside")
    with tracer.start_as_current_span("work") as span, logcontext.bound(sandbox_id="sbx1"):
        log.info("inside")
        with logcontext.bound(template_id="base", build_id=None):
            log.info("deeper")
    log.info("after")
    outside, inside, deeper, after = _records(captured)
    for rec in (outside, after):
        assert "trace_id" not in rec and "sandbox_id" not in rec
    ctx = span.get_span_context()
    assert inside["trace_id"] == f"{ctx.trace_id:032x}"
    assert inside["span_id"] == f"{ctx.span_id:016x}"
    assert inside["sandbox_id"] == "sbx1" and "template_id" not in inside
    assert deeper["sandbox_id"] == "sbx1" and deeper["template_id"] == "base"
    assert "build_id" not in deeper


def test_warnings_go_through_the_log(captured: io.StringIO) -> None:
    import warnings

    warnings.warn("careful", UserWarning, stacklevel=1)
    (rec,) = _records(captured)
    assert rec["logger"] == "py.warnings" and "careful" in str(rec["msg"])


def test_foreign_lines_are_wrapped_and_records_pass_through() -> None:
    rec = json.loads(wrap("panic: something\r\n", service="aenv-node", stream="stderr"))
    assert rec["msg"] == "panic: something" and rec["service"] == "aenv-node"
    assert rec["logger"] == "stderr" and rec["level"] == "WARNING"
    own = '{"ts": "x", "level": "INFO", "logger": "a", "msg": "m", "service": "aenv-api"}'
    assert wrap(own, service="aenv-node", stream="stdout") == own
    for odd in ('{"half": ', "[1, 2]", '{"a": 1} trailing'):
        assert json.loads(wrap(odd, service="s", stream="stdout"))["msg"] == odd


def test_progress_lines_and_markers() -> None:
    line = progress("ROLE-READY")
    assert message_of(line) == (PROGRESS, "ROLE-READY")
    assert marks(line, "ROLE-READY") and marks("ROLE-READY\n", "ROLE-READY")
    assert not marks(progress("ROLE-READY soon"), "ROLE-READY")
    other = json.dumps({"logger": "x", "msg": "ROLE-READY"})
    assert not marks(other, "ROLE-READY")  # a log line quoting the marker is not one


_WRITER = r"""
import logging, os, subprocess, sys
from pathlib import Path
from aenv import logs
from aenv.stack.stacklog import StackLog
log = StackLog(Path(sys.argv[1]), max_bytes=4000, backups=2)
logs.configure("aenv")
for i in range(60):
    logging.getLogger("w").info("record %d with \"quotes\"\nand a newline", i)
print("a plain print")
os.write(2, b"raw bytes on fd 2\n")
subprocess.run(["sh", "-c", "echo from a child; echo to its stderr >&2"], check=True)
sys.stdout.flush()
log.close()
"""


def test_the_stack_log_is_json_throughout_and_rotates(tmp_path: Path) -> None:
    path = tmp_path / "aenv.log"
    path.write_text("")
    path.chmod(0o600)
    run = subprocess.run(
        [sys.executable, "-c", _WRITER, str(path)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    files = [path, tmp_path / "aenv.log.1", tmp_path / "aenv.log.2"]
    assert all(f.exists() for f in files) and not (tmp_path / "aenv.log.3").exists()
    for f in files:
        assert f.stat().st_size <= 4000 + 400, f  # one record past the limit at most
        assert f.stat().st_mode & 0o077 == 0, f
    lines = [line for f in reversed(files) for line in f.read_text().splitlines()]
    records = [json.loads(line) for line in lines]  # every line: one JSON object
    msgs = [str(r["msg"]) for r in records]
    for text in ("a plain print", "raw bytes on fd 2", "from a child", "to its stderr"):
        assert text in msgs, (text, msgs[-8:])
    assert 'record 59 with "quotes"\nand a newline' in msgs  # the newest kept
    assert all(r["service"] == "aenv" for r in records)
