"""envd benchmark: cold start, `commands.run("true")` round trip, upload/download throughput.

Each figure sits next to its physical floor measured in the same run on the same host — a
bare interpreter start, a bare `subprocess.run` of the very command the SDK runs
(`/bin/bash -l -c true`), a local file copy — so the ratio shows what envd adds. The
round trip and transfers go through the unmodified e2b SDK (connectrpc for RPCs, httpx for
/files), pointed at an envd process on localhost with an access token set, as in a sandbox.

Run: `python -m bench.envd_bench [--iterations N] [--size-mib M]`.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.stats import emit, ratio, summary

REPO = Path(__file__).resolve().parent.parent
BENCH_USER = "aenvbench"
BENCH_HOME = "/tmp/aenv-envd-bench-home"
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _until_line(argv: list[str], prefix: str | None) -> tuple[float, float]:
    """Wall and CPU seconds from exec until `prefix` is printed (or the process exits)."""
    cpu0 = _child_cpu()
    t0 = time.perf_counter()
    p = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    wall = time.perf_counter() - t0
    if prefix is not None and not line.startswith(prefix):
        raise RuntimeError(f"unexpected output {line!r}")
    p.kill()
    p.wait()
    return wall, _child_cpu() - cpu0


def bench_cold_start(n: int) -> dict[str, Any]:
    envd = [
        _until_line([PYTHON, "-m", "envd", "--host", "127.0.0.1", "--port", "0"], "ENVD-READY")
        for _ in range(n)
    ]
    floor = [_until_line([PYTHON, "-c", "print('x')"], None) for _ in range(n)]
    envd_wall = summary([w for w, _ in envd])
    floor_wall = summary([w for w, _ in floor])
    envd_cpu = summary([c for _, c in envd])
    floor_cpu = summary([c for _, c in floor])
    return {
        "envd_wall_ms": envd_wall,
        "envd_cpu_ms": envd_cpu,
        "floor": "bare `python3 -c print()` start (same interpreter)",
        "floor_wall_ms": floor_wall,
        "floor_cpu_ms": floor_cpu,
        "ratio_wall_p50": ratio(envd_wall, floor_wall),
        "ratio_cpu_p50": ratio(envd_cpu, floor_cpu),
    }


def bench_user() -> tuple[str, str]:
    """A user with an empty home, so `bash -l` measures bash, not a developer's dotfiles
    (root's pyenv/cargo profile alone costs ~140 ms here). Created if missing (needs root)."""
    import pwd

    if os.geteuid() != 0:
        pw = pwd.getpwuid(os.geteuid())
        return pw.pw_name, pw.pw_dir
    try:
        pw = pwd.getpwnam(BENCH_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "-M", "-d", BENCH_HOME, "-s", "/bin/bash", BENCH_USER],
            check=True,
            capture_output=True,
        )
        pw = pwd.getpwnam(BENCH_USER)
    os.makedirs(pw.pw_dir, exist_ok=True)
    os.chown(pw.pw_dir, pw.pw_uid, pw.pw_gid)
    return pw.pw_name, pw.pw_dir


def start_envd(user: str) -> tuple[subprocess.Popen[str], str, str]:
    p = subprocess.Popen(
        [PYTHON, "-m", "envd", "--host", "127.0.0.1", "--port", "0", "--default-user", user],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    url = f"http://127.0.0.1:{int(line.split()[1])}"
    token = uuid.uuid4().hex
    import httpx

    httpx.post(f"{url}/init", json={"accessToken": token}).raise_for_status()
    return p, url, token


def make_sandbox(url: str, token: str) -> Any:
    from e2b import Sandbox
    from e2b.connection_config import ConnectionConfig
    from packaging.version import Version

    from envd.version import ENVD_VERSION

    headers = {"E2b-Sandbox-Id": "bench", "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
    return Sandbox(
        sandbox_id="bench",
        sandbox_domain=None,
        envd_version=Version(ENVD_VERSION),
        envd_access_token=token,
        traffic_access_token=None,
        connection_config=ConnectionConfig(
            sandbox_url=url, api_key="unused", extra_sandbox_headers=headers
        ),
    )


def _floor_kwargs(user: str, home: str) -> dict[str, Any]:
    """What envd does for the same command: same user, env, cwd, pipes."""
    kw: dict[str, Any] = {
        "env": {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,
            "USER": user,
            "LOGNAME": user,
        },
        "cwd": home,
        "stdin": subprocess.DEVNULL,
        "capture_output": True,
        "start_new_session": True,
        "check": True,
    }
    if os.geteuid() == 0 and user != "root":
        kw["user"] = user
        kw["group"] = user
        kw["extra_groups"] = []
    return kw


def _start_true(sbx: Any) -> None:
    """process.Process/Start of /bin/true through the SDK's own envd client, to the end."""
    from e2b.envd.process import process_pb

    stream = sbx.commands._rpc.start(
        process_pb.StartRequest(process=process_pb.ProcessConfig(cmd="/bin/true"), stdin=False),
        timeout_ms=60_000,
    )
    for _ in stream:
        pass


def bench_round_trip(sbx: Any, n: int, user: str, home: str) -> dict[str, Any]:
    argv = ["/bin/bash", "-l", "-c", "true"]
    kw = _floor_kwargs(user, home)
    for _ in range(10):  # warm the connection pool, page cache and envd's lazy imports
        sbx.commands.run("true")
        _start_true(sbx)
        subprocess.run(argv, **kw)
    envd_s: list[float] = []
    floor_s: list[float] = []
    raw_s: list[float] = []
    raw_floor_s: list[float] = []
    for _ in range(n):  # interleaved, so all see the same background load
        t0 = time.perf_counter()
        sbx.commands.run("true")
        envd_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.run(argv, **kw)
        floor_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        _start_true(sbx)
        raw_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.run(["/bin/true"], **kw)
        raw_floor_s.append(time.perf_counter() - t0)
    envd = summary(envd_s)
    floor = summary(floor_s)
    raw = summary(raw_s)
    raw_floor = summary(raw_floor_s)
    return {
        "user": user,
        "envd_ms": envd,
        "floor": "subprocess.run(['/bin/bash','-l','-c','true']), same user/env/cwd, captured",
        "floor_ms": floor,
        "overhead_p50_ms": round(envd["p50"] - floor["p50"], 3),
        "overhead_p99_ms": round(envd["p99"] - floor["p99"], 3),
        "ratio_p50": ratio(envd, floor),
        "target": "overhead <= 3 ms",
        "start_bin_true": {
            "what": "Start {cmd:/bin/true} via the SDK's process client vs subprocess.run",
            "envd_ms": raw,
            "floor_ms": raw_floor,
            "overhead_p50_ms": round(raw["p50"] - raw_floor["p50"], 3),
            "overhead_p99_ms": round(raw["p99"] - raw_floor["p99"], 3),
            "ratio_p50": ratio(raw, raw_floor),
        },
    }


# The floor copies in pieces of this size: what envd moves per syscall for a big body (it
# recv()s into a 1 MiB buffer and os.write()s what arrived; downloads use sendfile).
FLOOR_CHUNK = 1024 * 1024
# The size of the pieces of the chunked upload (an iterator of bytes): httpx's own read size.
ITER_CHUNK = 64 * 1024


def _local_copy(src: Path, dst: Path) -> None:
    """The floor: read a file and write another in user space, FLOOR_CHUNK at a time, no
    fsync — the work an upload's receiver must do at least, without the network."""
    buf = bytearray(FLOOR_CHUNK)
    view = memoryview(buf)
    fi = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    fo = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        while n := os.readv(fi, [buf]):
            piece = view[:n]
            while piece:
                piece = piece[os.write(fo, piece) :]
    finally:
        os.close(fi)
        os.close(fo)


def _exchange(url: str, head: bytes, body: Path | None = None, tail: bytes = b"") -> bytes:
    """One request on a bare socket (`Connection: close`): head, the file by sendfile(2),
    tail; returns the whole response."""
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(url)
    with socket.create_connection((u.hostname or "127.0.0.1", u.port or 80)) as s:
        s.sendall(head)
        if body is not None:
            with open(body, "rb") as f:
                s.sendfile(f)
        if tail:
            s.sendall(tail)
        reply = bytearray()
        while chunk := s.recv(65536):
            reply += chunk
    return bytes(reply)


def _raw_download(url: str, token: str, path: str) -> int:
    """GET /files on a bare socket, bytes received and dropped: what envd can serve."""
    import socket
    from urllib.parse import quote, urlsplit

    u = urlsplit(url)
    buf = bytearray(1024 * 1024)
    view = memoryview(buf)
    with socket.create_connection((u.hostname or "127.0.0.1", u.port or 80)) as s:
        s.sendall(
            f"GET /files?path={quote(path)} HTTP/1.1\r\nHost: x\r\n"
            f"X-Access-Token: {token}\r\nConnection: close\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(65536)
            if not chunk:
                raise RuntimeError("no response")
            head += chunk
        got = len(head.partition(b"\r\n\r\n")[2])
        while n := s.recv_into(view):
            got += n
    return got


def _raw_upload(url: str, token: str, src: Path, path: str) -> None:
    """POST /files, octet-stream, the body sent by sendfile(2): envd's side alone."""
    from urllib.parse import quote

    head = (
        f"POST /files?path={quote(path)} HTTP/1.1\r\nHost: x\r\nX-Access-Token: {token}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {src.stat().st_size}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    reply = _exchange(url, head, src)
    if not reply.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"upload failed: {reply[:200]!r}")


def _raw_upload_multipart(url: str, token: str, src: Path, path: str) -> None:
    """POST /files, multipart/form-data shaped as the SDK's (httpx's 32-hex-digit boundary,
    the target in the part's filename), the file's bytes sent by sendfile(2)."""
    boundary = uuid.uuid4().hex
    part = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{path}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    size = len(part) + src.stat().st_size + len(tail)
    head = (
        f"POST /files HTTP/1.1\r\nHost: x\r\nX-Access-Token: {token}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {size}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    reply = _exchange(url, head + part, src, tail)
    if not reply.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"upload failed: {reply[:200]!r}")


def _envd_cpu_ns(pid: int) -> int:
    """On-CPU time of envd (single-threaded: a test asserts it), from the scheduler, in ns."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def _own_cpu_s() -> float:
    """CPU time of this process, all threads: the SDK client, or the floor's copy."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _conditions() -> dict[str, Any]:
    """How busy the machine was: the ratios mean little on a saturated host."""
    out: dict[str, Any] = {"loadavg": [round(x, 2) for x in os.getloadavg()]}
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline().split()
        out["cpu_pressure_some_avg10"] = float(some[1].partition("=")[2])
    except (OSError, IndexError, ValueError):
        pass
    return out


def _spread(xs: list[float], digits: int = 3) -> dict[str, float]:
    ys = sorted(xs)
    return {
        "p50": round(statistics.median(ys), digits),
        "min": round(ys[0], digits),
        "max": round(ys[-1], digits),
    }


def _bound(floor_cpu: float, cpu: list[float]) -> float | None:
    spent = statistics.median(cpu)
    return round(floor_cpu / spent, 3) if spent > 0.001 else None


def bench_throughput(
    sbx: Any, size_mib: int, rounds: int, url: str, token: str, envd_pid: int, warmup: int = 1
) -> dict[str, Any]:
    """Every transfer kind next to the floor, interleaved.

    Fairness: one source file (random bytes) in the page cache for every kind and the floor;
    every destination a new file, removed after its round; no fsync anywhere (envd does not
    fsync uploads, so neither does the floor); `sync` before every timed operation, so none
    pays for another's writeback. Each round runs every kind once, in an order rotated per
    round, so load from the rest of the machine falls on all kinds alike; a kind's ratio is
    taken per round against the floor of the same round, and the median of those is
    reported with its spread.
    """
    tmp = Path(tempfile.mkdtemp(prefix="envd-bench-"))
    try:
        src = tmp / "src.bin"
        block = os.urandom(1024 * 1024)
        with open(src, "wb") as w:
            for _ in range(size_mib):
                w.write(block)
        size = size_mib * 1024 * 1024

        def sdk_upload(dst: Path) -> None:
            with open(src, "rb") as f:
                sbx.files.write(str(dst), f)  # octet-stream with Content-Length

        def sdk_upload_multipart(dst: Path) -> None:
            with open(src, "rb") as f:
                sbx.files.write(str(dst), f, use_octet_stream=False)

        def sdk_upload_chunked(dst: Path) -> None:
            def pieces() -> Any:
                with open(src, "rb") as f:
                    while piece := f.read(ITER_CHUNK):
                        yield piece

            sbx.files.write(str(dst), pieces())  # an iterator: Transfer-Encoding: chunked

        def sdk_download_to_file(dst: Path) -> None:
            with open(dst, "wb") as out, sbx.files.read(str(src), format="stream") as stream:
                for chunk in stream:
                    out.write(chunk)

        def sdk_download_to_memory(dst: Path) -> None:
            data = sbx.files.read(str(src), format="bytes")  # what most SDK code does
            if len(data) != size:
                raise RuntimeError(f"got {len(data)} bytes")

        def envd_serve(dst: Path) -> None:
            if (got := _raw_download(url, token, str(src))) != size:
                raise RuntimeError(f"got {got} bytes")

        kinds: dict[str, tuple[str, Any]] = {
            "local_copy": (
                f"the floor: read src + write a new file in user space, {FLOOR_CHUNK >> 10} KiB "
                "pieces (os.readv/os.write), no fsync",
                lambda d: _local_copy(src, d),
            ),
            "kernel_copy": (
                "reference: shutil.copyfile (sendfile(2) file to file, no user-space pass)",
                lambda d: shutil.copyfile(src, d),
            ),
            "upload": (
                "SDK files.write(path, open(src,'rb')): octet-stream, Content-Length",
                sdk_upload,
            ),
            "upload_multipart": (
                "SDK files.write(path, file, use_octet_stream=False): multipart/form-data",
                sdk_upload_multipart,
            ),
            "upload_chunked": (
                f"SDK files.write(path, iterator of {ITER_CHUNK >> 10} KiB "
                "pieces): octet-stream, Transfer-Encoding: chunked",
                sdk_upload_chunked,
            ),
            "envd_receive": (
                "POST /files octet-stream from a bare socket (sendfile): envd's "
                "side of an upload alone",
                lambda d: _raw_upload(url, token, src, str(d)),
            ),
            "envd_receive_multipart": (
                "POST /files multipart (SDK-shaped) from a bare socket "
                "(sendfile): envd's multipart parsing alone",
                lambda d: _raw_upload_multipart(url, token, src, str(d)),
            ),
            "download_to_file": (
                "SDK files.read(format='stream') written to a new local file",
                sdk_download_to_file,
            ),
            "download_to_memory": ("SDK files.read(format='bytes')", sdk_download_to_memory),
            "envd_serve": (
                "GET /files read off a bare socket and dropped: envd's side alone (sendfile)",
                envd_serve,
            ),
        }
        names = list(kinds)
        wall: dict[str, list[float]] = {k: [] for k in names}
        envd_cpu: dict[str, list[float]] = {k: [] for k in names}
        own_cpu: dict[str, list[float]] = {k: [] for k in names}
        before = _conditions()
        for r in range(warmup + rounds):
            turn = r % len(names)
            for name in names[turn:] + names[:turn]:
                dst = tmp / f"out-{name}-{r}.bin"
                os.sync()
                e0, c0, t0 = _envd_cpu_ns(envd_pid), _own_cpu_s(), time.perf_counter()
                kinds[name][1](dst)
                dt = time.perf_counter() - t0
                e1, c1 = _envd_cpu_ns(envd_pid), _own_cpu_s()
                if dst.exists():
                    if dst.stat().st_size != size:
                        raise RuntimeError(f"{name}: {dst.stat().st_size} bytes, not {size}")
                    dst.unlink()
                if r >= warmup:
                    wall[name].append(dt)
                    envd_cpu[name].append((e1 - e0) / 1e9)
                    own_cpu[name].append(c1 - c0)
        after = _conditions()

        gib = size / (1024**3)
        out: dict[str, Any] = {}
        for name in names:
            per_round = [wall["local_copy"][i] / t for i, t in enumerate(wall[name])]
            cpu = [e + c for e, c in zip(envd_cpu[name], own_cpu[name], strict=True)]
            floor_cpu = statistics.median(own_cpu["local_copy"])
            out[name] = {
                "what": kinds[name][0],
                "mib_s": _spread([size_mib / t for t in wall[name]], 1),
                "ratio": _spread(per_round),
                "ratio_vs_kernel_copy": round(
                    statistics.median(wall["kernel_copy"][i] / t for i, t in enumerate(wall[name])),
                    3,
                ),
                "envd_cpu_ms_per_gib": round(statistics.median(envd_cpu[name]) * 1000 / gib),
                "client_cpu_ms_per_gib": round(statistics.median(own_cpu[name]) * 1000 / gib),
                # The ratio a host with no spare core would see: floor CPU / total CPU.
                "cpu_bound_ratio": round(floor_cpu / statistics.median(cpu), 3),
                # The best ratio each side allows when it has a core to itself: which of
                # envd and its client limits the transfer.
                "envd_bound_ratio": _bound(floor_cpu, envd_cpu[name]),
                "client_bound_ratio": _bound(floor_cpu, own_cpu[name]),
            }

        def p50(name: str) -> float:
            return float(out[name]["ratio"]["p50"])

        return {
            "size_mib": size_mib,
            "rounds": rounds,
            "warmup_rounds": warmup,
            "method": "one page-cached source file for all; a new destination file per "
            "operation; no fsync anywhere (envd does not fsync uploads); sync before every "
            "timed operation; all kinds once per round in a rotated order; ratio = floor "
            "time / kind time within the same round, median (min..max) over the rounds",
            "floor": out["local_copy"]["what"],
            "local_copy_mib_s": out["local_copy"]["mib_s"]["p50"],
            "upload_ratio": p50("upload"),
            "upload_multipart_ratio": p50("upload_multipart"),
            "upload_chunked_ratio": p50("upload_chunked"),
            "envd_receive_ratio": p50("envd_receive"),
            "envd_receive_multipart_ratio": p50("envd_receive_multipart"),
            "download_to_file_ratio": p50("download_to_file"),
            "download_to_memory_ratio": p50("download_to_memory"),
            "envd_serve_ratio": p50("envd_serve"),
            "target": "ratio >= 0.5",
            "kinds": out,
            "conditions": {"before": before, "after": after},
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--iterations", type=int, default=300, help="round trips to time")
    ap.add_argument("--starts", type=int, default=15, help="cold starts to time")
    ap.add_argument("--size-mib", type=int, default=256, help="transfer size")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of transfers to time")
    ap.add_argument(
        "--only",
        choices=("cold_start", "round_trip", "throughput"),
        help="run one part (the JSON then goes to envd-<part>.json)",
    )
    args = ap.parse_args()
    doc: dict[str, Any] = {"python": PYTHON}
    if args.only in (None, "cold_start"):
        doc["cold_start"] = bench_cold_start(args.starts)
    if args.only != "cold_start":
        user, home = bench_user()
        proc, url, token = start_envd(user)
        try:
            sbx = make_sandbox(url, token)
            if args.only in (None, "round_trip"):
                doc["run_true_round_trip"] = bench_round_trip(sbx, args.iterations, user, home)
            if args.only in (None, "throughput"):
                doc["throughput"] = bench_throughput(
                    sbx, args.size_mib, args.rounds, url, token, proc.pid
                )
        finally:
            proc.terminate()
            proc.wait()
    emit("envd" if args.only is None else f"envd-{args.only}", doc)


if __name__ == "__main__":
    main()
