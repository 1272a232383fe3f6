"""Several NATS servers in one URL setting, and the login they carry."""

from bus import BusSettings


def test_one_server() -> None:
    s = BusSettings(nats_url="nats://127.0.0.1:4222")
    assert s.servers == ["nats://127.0.0.1:4222"]
    assert s.login() == {}


def test_a_cluster_comma_separated_with_its_login() -> None:
    s = BusSettings(nats_url="nats://aenv:p%40ss@a:4222, nats://aenv:p%40ss@b:4222,,")
    assert s.servers == ["nats://aenv:p%40ss@a:4222", "nats://aenv:p%40ss@b:4222"]
    # given as options too: the servers a cluster announces come without it
    assert s.login() == {"user": "aenv", "password": "p@ss"}


def test_a_token() -> None:
    assert BusSettings(nats_url="nats://s3cret@a:4222").login() == {"token": "s3cret"}
