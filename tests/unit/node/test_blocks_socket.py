"""A block service socket path too long for a unix socket is refused at the node's start,
naming the setting that fixes it (issue 29's hardening), not met later as a bind error."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from workers.node.settings import UNIX_PATH_MAX, NodeSettings, socket_path_problem


def test_the_limit_is_the_kernel_s(tmp_path: Path) -> None:
    """107 bytes bind, 108 do not: the number is Linux's, not a guess."""
    base = str(tmp_path) + "/"
    fits = Path(base + "s" * (UNIX_PATH_MAX - len(base)))
    over = Path(str(fits) + "x")
    for path, ok in ((fits, True), (over, False)):
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.bind(str(path))
                bound = True
            except OSError:
                bound = False
        assert bound is ok
        assert (socket_path_problem(path) is None) is ok


def test_a_lazy_node_with_a_long_state_dir_is_refused_naming_the_setting() -> None:
    deep = Path("/var/lib/" + "d" * 100)
    with pytest.raises(ValidationError, match="AENV_BLOCKS_SOCKET"):
        NodeSettings(state_dir=deep, lazy_images="on")
    NodeSettings(state_dir=deep, lazy_images="off")  # no service: nothing to bind
    NodeSettings(state_dir=deep, lazy_images="on", blocks_socket=Path("/run/aenv/blocks.sock"))


def test_a_long_socket_set_explicitly_is_refused_whatever_the_mode() -> None:
    with pytest.raises(ValidationError, match="at most 107"):
        NodeSettings(blocks_socket=Path("/run/" + "s" * 120))
