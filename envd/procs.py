"""Processes started through process.Process: spawn, output fan-out, input, exit.

Each process is watched with non-blocking fds on the event loop — no threads, no asyncio
subprocess transports — which keeps a `commands.run("true")` round trip close to a bare
fork+exec. Output is encoded once into ready-to-send protobuf-JSON payloads and handed to
every attached stream; a process outlives its streams and anyone may attach by pid. Its
output is read on while no stream is attached (the process never blocks on a full pipe
then), its tail kept (`envd.tails`) for the next stream and, after its end, with its exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import subprocess
from dataclasses import dataclass
from typing import Any

from envd import log, wire
from envd.connect import encode
from envd.fdwriter import FdWriter
from envd.tails import Ended, EndedTable, OutputTail
from envd.users import User

READ_CHUNK = 64 * 1024
# Backpressure: stop reading a process's output while an attached stream has this many
# chunks queued (up to ~8 MiB), so `yes` behind a slow client blocks instead of filling RAM.
QUEUE_HIGH = 128
QUEUE_LOW = 16
DATA_END = b'"}}}'


@dataclass
class SpawnSpec:
    """Everything needed to start a process, already validated and resolved."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    user: User
    stdin: bool
    pty_size: tuple[int, int] | None  # (cols, rows)
    timeout_s: float | None
    config_json: dict[str, Any]  # ProcessConfig as the client sent it, for List
    tag: str | None


class Subscriber:
    """One attached stream: (end, payload, number of its first output chunk) queue up here
    until the stream sends them."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[bool, bytes, int]] = asyncio.Queue()
        #: the first chunk of what the stream is sending now (None: not sending)
        self.sending: int | None = None


class Proc:
    """A running process and the streams attached to it."""

    def __init__(
        self, table: ProcessTable, spec: SpawnSpec, popen: subprocess.Popen[bytes]
    ) -> None:
        self.table = table
        self.spec = spec
        self.popen = popen
        self.pid = popen.pid
        self.tag = spec.tag
        self.subscribers: list[Subscriber] = []
        self.stdin: FdWriter | None = None
        self.pty_master: int | None = None
        self._readers: dict[int, bytes] = {}  # fd -> payload prefix
        self._pidfd: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.wait_status: int | None = None
        self.finished = False
        self.paused = False
        self.tail = OutputTail()
        #: number of the first chunk read while no stream was attached (None: all sent)
        self.unsent_from: int | None = None

    # --- output -------------------------------------------------------------------------

    def _broadcast(self, payload: bytes, end: bool = False, seq: int = -1) -> None:
        for sub in self.subscribers:
            sub.queue.put_nowait((end, payload, seq))

    def _on_readable(self, fd: int) -> None:
        self._read_once(fd)

    def _read_once(self, fd: int) -> bool:
        """Read what is there; False once the fd is exhausted (EOF, EIO) or would block."""
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return False
        except OSError as e:  # EIO: the pty's slave side is gone
            if e.errno not in (errno.EIO, errno.EBADF):
                log.warn("process output read failed", pid=self.pid, error=str(e))
            data = b""
        if not data:
            self._close_reader(fd)
            return False
        prefix = self._readers[fd]
        seq = self.tail.add(prefix, data)
        if not self.subscribers:
            if self.unsent_from is None:
                self.unsent_from = seq
        else:
            self._broadcast(prefix + wire.b64(data).encode() + DATA_END, seq=seq)
            if not self.paused and any(s.queue.qsize() > QUEUE_HIGH for s in self.subscribers):
                self.paused = True
                for rfd in self._readers:
                    self.table.loop.remove_reader(rfd)
        return True

    def maybe_resume(self) -> None:
        """Called by a stream after it sent a batch: read output again once all caught up."""
        if self.paused and all(s.queue.qsize() < QUEUE_LOW for s in self.subscribers):
            self.paused = False
            if self.wait_status is None:
                for rfd in self._readers:
                    self.table.loop.add_reader(rfd, self._on_readable, rfd)

    def _close_reader(self, fd: int) -> None:
        if fd in self._readers:
            del self._readers[fd]
            self.table.loop.remove_reader(fd)  # harmless when paused (not registered)
            if fd != self.pty_master:
                os.close(fd)

    # --- exit ---------------------------------------------------------------------------

    def _on_exit(self) -> None:
        if self.wait_status is not None:
            return
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = self.pid, 0
        if pid == 0:
            return  # spurious wake-up: still running
        self.wait_status = status
        self.popen.returncode = (
            -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        )
        log.info("process ended", pid=self.pid, exit=self.popen.returncode)
        if self._pidfd is not None:
            self.table.loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self._finish()

    def _finish(self) -> None:
        # Everything the process wrote before exiting is already in the pipes: drain it, then
        # stop — grandchildren that keep the pipe open do not hold the end event back.
        for fd in list(self._readers):
            # A pipe holds at most 1 MiB (64 KiB by default): bounded, even if an orphaned
            # grandchild keeps writing into it.
            for _ in range(16):
                if not self._read_once(fd):
                    break
            self._close_reader(fd)
        if self.stdin is not None:
            self.stdin.abandon()
        if self.pty_master is not None:
            with contextlib.suppress(OSError):
                os.close(self.pty_master)
        if self._timer is not None:
            self._timer.cancel()
        self.finished = True
        assert self.wait_status is not None
        end = encode({"event": {"end": wire.end_event(self.wait_status)}})
        self._broadcast(end, end=True)
        self.subscribers.clear()
        self.table.remove(self)
        ended = self.table.ended
        ended.add(Ended(self.pid, self.tag, self.spec.config_json, self.tail, end, ended.now()))

    # --- control ------------------------------------------------------------------------

    def subscribe(self) -> Subscriber:
        """A new stream; it first gets what was read while no stream was attached."""
        sub = Subscriber()
        if self.unsent_from is not None:
            for seq, payload in replay(self.tail, self.unsent_from):
                sub.queue.put_nowait((False, payload, seq))
            self.unsent_from = None
        self.subscribers.append(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        if sub in self.subscribers:
            self.subscribers.remove(sub)
            if not self.subscribers and self.wait_status is None:
                self._keep_unsent(sub)
        self.maybe_resume()  # a dropped slow stream must not keep the process blocked

    def _keep_unsent(self, sub: Subscriber) -> None:
        """The last stream left (cut): what it had not sent yet goes to the next one."""
        first = sub.sending
        while first is None and not sub.queue.empty():
            end, _, seq = sub.queue.get_nowait()
            if not end:
                first = seq
        if first is not None:
            self.unsent_from = first

    def signal(self, signum: int) -> None:
        if self.wait_status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def write_input(self, data: bytes, pty: bool) -> None:
        if self.stdin is None:
            raise BrokenPipeError("stdin not enabled or closed")
        if pty != (self.pty_master is not None):
            raise ValueError("pty input to a non-pty process" if pty else "stdin input to a pty")
        self.stdin.write(data)

    def close_stdin(self) -> None:
        """EOF on stdin; a no-op without stdin (as in envd). PTYs want Ctrl-D instead."""
        if self.pty_master is not None:
            raise BrokenPipeError("cannot close stdin of a pty process; send Ctrl-D (0x04)")
        if self.stdin is not None:
            self.stdin.close()

    def resize(self, cols: int, rows: int) -> None:
        if self.pty_master is None:
            raise ValueError("process has no pty")
        _set_winsize(self.pty_master, cols, rows)

    def info_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"config": self.spec.config_json, "pid": self.pid}
        if self.tag is not None:
            out["tag"] = self.tag
        return out


def replay(tail: OutputTail, seq: int = 0) -> list[tuple[int, bytes]]:
    """Data events of what `tail` kept from chunk `seq` on (a stream's key is its prefix),
    each with the number of its first chunk."""
    return [(s, prefix + wire.b64(data).encode() + DATA_END) for s, prefix, data in tail.since(seq)]


def _set_winsize(fd: int, cols: int, rows: int) -> None:
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _popen_pty(
    spec: SpawnSpec, size: tuple[int, int], kwargs: dict[str, Any]
) -> tuple[subprocess.Popen[bytes], int]:
    """The process on a new terminal (its controlling tty), and the terminal's master side."""
    user = spec.user
    master, slave = os.openpty()
    _set_winsize(master, *size)
    if not user.is_current and os.geteuid() == 0:
        with contextlib.suppress(OSError):
            os.fchown(slave, user.uid, -1)
    try:
        popen = subprocess.Popen(
            spec.argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=spec.cwd,
            env=spec.env,
            start_new_session=True,
            preexec_fn=_make_controlling_tty,
            **kwargs,
        )
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    return popen, master


def _popen_pipes(spec: SpawnSpec, kwargs: dict[str, Any]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        spec.argv,
        stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=spec.cwd,
        env=spec.env,
        start_new_session=True,
        **kwargs,
    )


def _make_controlling_tty() -> None:  # pragma: no cover - runs in the child
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class ProcessTable:
    """All processes envd started and that have not been reaped yet, by pid."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ended: EndedTable | None = None) -> None:
        self.loop = loop
        self.procs: dict[int, Proc] = {}
        #: processes that have ended, kept a while for `commands.connect(pid)`
        self.ended = ended if ended is not None else EndedTable()
        self._use_pidfd = hasattr(os, "pidfd_open")
        self._sigchld_installed = False

    def remove(self, proc: Proc) -> None:
        self.procs.pop(proc.pid, None)

    def find(self, pid: int | None = None, tag: str | None = None) -> Proc | None:
        if pid is not None:
            return self.procs.get(pid)
        if tag is not None:
            for p in self.procs.values():
                if p.tag == tag:
                    return p
        return None

    def spawn(self, spec: SpawnSpec, first: Subscriber | None = None) -> Proc:
        """Start the process; `first` is subscribed before any output can be read."""
        user = spec.user
        kwargs: dict[str, Any] = {}
        if not user.is_current:
            kwargs.update(user=user.uid, group=user.gid, extra_groups=user.groups())
        master: int | None = None
        if spec.pty_size is not None:
            popen, master = _popen_pty(spec, spec.pty_size, kwargs)
        else:
            popen = _popen_pipes(spec, kwargs)
        proc = Proc(self, spec, popen)
        if first is not None:
            proc.subscribers.append(first)
        self.procs[proc.pid] = proc
        self.ended.forget(proc.pid)
        if master is not None:
            self._read_pty(proc, master)
        else:
            self._read_pipes(proc, popen)
        self._watch_exit(proc)
        # the sandbox's log (`e2b sandbox logs`, `aenv logs`) says what ran: the command,
        # never its environment (where secrets are passed)
        log.info(
            "process started",
            pid=proc.pid,
            user=user.name,
            cmd=" ".join(spec.argv)[:200],
            tag=spec.tag,
        )
        if spec.timeout_s is not None:
            proc._timer = self.loop.call_later(spec.timeout_s, proc.signal, signal.SIGKILL)
        return proc

    def _read_pty(self, proc: Proc, master: int) -> None:
        """Output and input both go through the terminal's master side."""
        os.set_blocking(master, False)
        proc.pty_master = master
        proc.stdin = FdWriter(self.loop, master, owns_fd=False)
        proc._readers[master] = b'{"event":{"data":{"pty":"'
        self.loop.add_reader(master, proc._on_readable, master)

    def _read_pipes(self, proc: Proc, popen: subprocess.Popen[bytes]) -> None:
        """The pipes' descriptors, taken from their file objects (duplicated, non-blocking)
        and read and written by the event loop."""
        loop = self.loop
        assert popen.stdout is not None and popen.stderr is not None
        for f, prefix in (
            (popen.stdout, b'{"event":{"data":{"stdout":"'),
            (popen.stderr, b'{"event":{"data":{"stderr":"'),
        ):
            fd = os.dup(f.fileno())
            f.close()
            os.set_blocking(fd, False)
            proc._readers[fd] = prefix
            loop.add_reader(fd, proc._on_readable, fd)
        popen.stdout = popen.stderr = None
        if popen.stdin is not None:
            fd = os.dup(popen.stdin.fileno())
            popen.stdin.close()
            popen.stdin = None
            os.set_blocking(fd, False)
            proc.stdin = FdWriter(loop, fd, owns_fd=True)

    def _watch_exit(self, proc: Proc) -> None:
        if self._use_pidfd:
            try:
                proc._pidfd = os.pidfd_open(proc.pid)
            except OSError:
                self._use_pidfd = False
            else:
                self.loop.add_reader(proc._pidfd, proc._on_exit)
                return
        if not self._sigchld_installed:
            self.loop.add_signal_handler(signal.SIGCHLD, self._reap)
            self._sigchld_installed = True
        self.loop.call_soon(self._reap)  # it may have exited already

    def _reap(self) -> None:
        for proc in list(self.procs.values()):
            proc._on_exit()

    def kill_all(self) -> None:
        for proc in list(self.procs.values()):
            proc.signal(signal.SIGKILL)
