"""`python -m workers.node.image`: build guest images from the command line.

    build-base [--cache DIR] [--force] [--size 2G]
    build-code-interpreter [--cache DIR] [--size 2G]
    build-oci <layout-dir-or-archive> --name NAME [--ref TAG] [--cache DIR] [--force] [--size 2G]
    build-runtime [--cache DIR]
    cmdline [--cache DIR] [--image NAME|DIGEST] [--no-net] [--debug]
    gc [--cache DIR] [--keep N] [--dry-run]

Progress lines carry the seconds since start; the last lines are the digest and paths.
Any failure is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .build import GuestImage, build_base, build_from_oci, find_image
from .cache import cache_root, collect_garbage
from .cmdline import kernel_cmdline
from .disk import DEFAULT_FREE, parse_size
from .errors import ImageError
from .runtime import build_runtime


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workers.node.image", description=__doc__.split("\n")[0]
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--cache", type=Path, help="cache dir (default $AENV_IMAGE_CACHE or /var/lib/aenv/images)"
    )
    common.add_argument("--force", action="store_true", help="rebuild even if cached")
    common.add_argument(
        "--free",
        default=str(DEFAULT_FREE),
        help="free space the root disk keeps beyond the image, e.g. 8G",
    )
    sub.add_parser("build-base", parents=[common], help="the default Debian image")
    sub.add_parser(
        "build-code-interpreter",
        parents=[common],
        help="base + Jupyter kernels + the code-interpreter server",
    )
    rt = sub.add_parser("build-runtime", help="envd's runtime disk (attached to every VM)")
    rt.add_argument("--cache", type=Path)
    oci = sub.add_parser("build-oci", parents=[common], help="an image from an OCI layout/archive")
    oci.add_argument("source", type=Path)
    oci.add_argument("--name", required=True)
    oci.add_argument("--ref", help="tag to pick when the layout holds several images")
    cl = sub.add_parser("cmdline", help="print the kernel command line for a cached image")
    cl.add_argument("--cache", type=Path)
    cl.add_argument("--image", default="base")
    cl.add_argument("--no-net", action="store_true")
    cl.add_argument("--debug", action="store_true")
    gc = sub.add_parser("gc", help="delete old unnamed images that no process has open")
    gc.add_argument("--cache", type=Path)
    gc.add_argument("--keep", type=int, default=3, help="newest images always kept")
    gc.add_argument("--dry-run", action="store_true")
    return p


def _report(img: GuestImage) -> None:
    print(f"digest  {img.digest}")
    print(f"kernel  {img.kernel}")
    print(f"initrd  {img.initrd}")
    print(f"rootfs  {img.rootfs}")
    print(f"cmdline {kernel_cmdline(img)}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit status."""
    args = _parser().parse_args(argv)
    t0 = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    try:
        if args.cmd == "build-base":
            _report(
                build_base(
                    args.cache,
                    progress=progress,
                    force=args.force,
                    free_bytes=parse_size(args.free),
                )
            )
        elif args.cmd == "build-code-interpreter":
            from .codeint import build_code_interpreter

            _report(
                build_code_interpreter(
                    args.cache, progress=progress, free_bytes=parse_size(args.free)
                )
            )
        elif args.cmd == "build-oci":
            img = build_from_oci(
                args.source,
                args.name,
                args.cache,
                progress=progress,
                force=args.force,
                free_bytes=parse_size(args.free),
                ref=args.ref,
            )
            _report(img)
        elif args.cmd == "build-runtime":
            runtime = build_runtime(args.cache, progress=progress)
            print(f"digest  {runtime.digest}")
            print(f"disk    {runtime.path}")
        elif args.cmd == "gc":
            for d in collect_garbage(cache_root(args.cache), args.keep, dry_run=args.dry_run):
                print(f"{'would remove' if args.dry_run else 'removed'} {d}")
        else:
            img = find_image(args.image, args.cache)
            print(
                kernel_cmdline(img, ip=None if args.no_net else "169.254.0.21/30", debug=args.debug)
            )
    except (ImageError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 1
    return 0
