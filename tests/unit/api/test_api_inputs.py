"""What a request may carry (`api.inputs`, `api.ids`, the create body's limits): pure."""

import json

import pytest
from pydantic import ValidationError

from api import ids
from api.errors import ApiError
from api.inputs import MAX_DEPTH, body_problem
from api.wire import MAX_ENV_VARS, MAX_METADATA, NewSandbox


def test_a_body_nested_beyond_the_limit_is_refused_without_recursing() -> None:
    assert body_problem(b"[" * 100_000 + b"]" * 100_000) == (
        f"JSON body is nested more than {MAX_DEPTH} levels deep"
    )
    at_limit = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert body_problem(at_limit) is None
    assert body_problem(b"[" + at_limit + b"]") is not None


def test_a_nul_anywhere_in_the_body_is_refused() -> None:
    for doc in ({"a": "\0"}, {"\0": 1}, [[["x\0y"]]], {"a": {"b": ["ok", "\0"]}}):
        assert body_problem(json.dumps(doc).encode()) == (
            "a string in the JSON body contains a NUL byte"
        )
    # an escaped backslash followed by u0000 is six characters, not a NUL
    assert body_problem(json.dumps({"a": "\\u0000"}).encode()) is None


def test_the_sdks_create_body_passes() -> None:
    body = b'{"templateID":"base","timeout":120,"metadata":{"suite":"acc"},"envVars":{"FOO":"bar"}}'
    assert body_problem(body) is None
    assert body_problem(b"not json") is not None


def test_ids_outside_the_alphabet_name_nothing() -> None:
    assert ids.is_sandbox_id("i1ab2cd3ef4gh5ij6kl7")
    for bad in ("a.b", "a*", "a>", "a b", "A1", "a\0b", "", "x" * 64):
        assert not ids.is_sandbox_id(bad)
    assert ids.is_template_ref("code-interpreter-v1") and ids.is_template_ref("snap:v1")
    for bad in ("a.b", "a*", "a b", "-a", "a\0"):
        assert not ids.is_template_ref(bad)


def test_build_ids_are_uuids() -> None:
    assert ids.build_id("00000000-0000-0000-0000-000000000001")
    with pytest.raises(ApiError) as e:
        ids.build_id("a.b")
    assert e.value.status == 400


def test_metadata_and_env_vars_are_bounded() -> None:
    NewSandbox.model_validate(
        {
            "templateID": "base",
            "metadata": {"k": "v" * (MAX_METADATA - 1)},
            "envVars": {"E": "e" * (MAX_ENV_VARS - 1)},
        }
    )
    with pytest.raises(ValidationError, match="metadata take"):
        NewSandbox.model_validate({"templateID": "base", "metadata": {"k": "v" * MAX_METADATA}})
    with pytest.raises(ValidationError, match="envVars take"):
        NewSandbox.model_validate({"templateID": "base", "envVars": {"E": "é" * MAX_ENV_VARS}})


@pytest.mark.parametrize(
    ("path", "short"),
    [
        # e2b 1.3.3's `{sandboxID}-{clientID}`: E2B's API keeps the sandbox id
        ("/sandboxes/i1ab2cd3-aenv", "/sandboxes/i1ab2cd3"),
        ("/sandboxes/i1ab2cd3-aenv/timeout", "/sandboxes/i1ab2cd3/timeout"),
        ("/v2/sandboxes/i1ab2cd3-6532622b/logs", "/v2/sandboxes/i1ab2cd3/logs"),
        # a path that names a plain id, or no sandbox, is left as it is
        ("/sandboxes/i1ab2cd3/timeout", "/sandboxes/i1ab2cd3/timeout"),
        ("/sandboxes", "/sandboxes"),
        ("/sandboxes/metrics", "/sandboxes/metrics"),
        ("/templates/my-template", "/templates/my-template"),
        ("/sandboxes/i1ab2cd3-a-b", "/sandboxes/i1ab2cd3-a-b"),  # not id-client: a 404
        ("/x/sandboxes/i1ab2cd3-aenv", "/x/sandboxes/i1ab2cd3-aenv"),
    ],
)
def test_a_client_id_after_the_sandbox_id_is_cut(path: str, short: str) -> None:
    assert ids.short_path(path) == short
