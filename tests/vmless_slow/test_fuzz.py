"""Schemathesis over the live API's OpenAPI document: every route, a bounded number of
generated requests each (valid per the document, then deliberately invalid), with the API
key. No answer may be a 5xx, and every answer must be one the document declares, in the
shape it declares — errors included, which are E2B's `{code, message}`.

`AENV_FUZZ_EXAMPLES` (default 30) is the number of cases per route and mode; the cases are
derandomized, so a failure reproduces. 30 keeps the run under a minute on two busy cores."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis.strategies import SearchStrategy
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.vmless.conftest import VmlessStack

EXAMPLES = int(os.environ.get("AENV_FUZZ_EXAMPLES", "30"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
OPENAPI = "/openapi/openapi.json"


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def test_the_openapi_document_declares_the_errors_the_api_sends(vmless: VmlessStack) -> None:
    doc = httpx.get(vmless.api_url + OPENAPI, timeout=30).json()
    assert "status_code" not in str(doc) and "detail" not in str(doc)
    checked = 0
    for path, item in doc["paths"].items():
        for method, op in item.items():
            errors = {s: r for s, r in op["responses"].items() if int(s) >= 400}
            assert "500" in errors, (method, path)
            if path not in ("/health", "/health/ready", "/health/live", "/metrics"):
                assert "400" in errors, (method, path)
            for status, response in errors.items():
                if path in ("/health", "/health/ready") and status == "503":
                    continue  # the readiness body itself, saying what is down
                schema = _resolve(doc, response["content"]["application/json"]["schema"])
                assert schema["properties"] == {
                    "code": {"type": "integer"},
                    "message": {"type": "string"},
                }, (method, path)
                assert set(schema["required"]) == {"code", "message"}
                checked += 1
    assert checked > 100


def test_fuzz_every_route(vmless: VmlessStack, capsys: pytest.CaptureFixture[str]) -> None:
    schema = schemathesis.openapi.from_url(vmless.api_url + OPENAPI, timeout=30)
    headers = {"X-API-KEY": vmless.api_key}
    results = list(schema.get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) == len(results), "the document has operations schemathesis cannot read"
    cases, statuses, failures = 0, dict[int, int](), list[str]()

    def fuzz(label: str, strategy: SearchStrategy[schemathesis.Case[Any]], examples: int) -> None:
        @settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def run(case: schemathesis.Case[Any]) -> None:
            nonlocal cases
            response = case.call(base_url=vmless.api_url, headers=headers, timeout=60)
            cases += 1
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            try:
                case.validate_response(response, checks=CHECKS, headers=headers)
            except (AssertionError, FailureGroup) as e:  # collected, reported below
                failures.append(f"{label}: {e}"[:1500])

        run()

    for op in operations:
        # the document's examples (a create from `base`) first, then generated cases
        for strategy in op.get_strategies_from_examples():
            fuzz(f"{op.label} [examples]", strategy, 3)
        fuzz(f"{op.label} [positive]", op.as_strategy(GenerationMode.POSITIVE), EXAMPLES)
        # Unsatisfiable: nothing in the operation to make invalid (no parameters, no body)
        with contextlib.suppress(Unsatisfiable):
            fuzz(f"{op.label} [negative]", op.as_strategy(GenerationMode.NEGATIVE), EXAMPLES)

    server_errors = sum(n for status, n in statuses.items() if status >= 500)
    with capsys.disabled():
        print(
            f"\nfuzz: {cases} cases over {len(operations)} operations, "
            f"{server_errors} 5xx, statuses {dict(sorted(statuses.items()))}"
        )
    assert len(operations) >= 25, [op.label for op in operations]
    assert cases >= len(operations) * min(EXAMPLES, 5), "the fuzz ran too few cases"
    assert statuses.get(201), "no example created a sandbox"
    assert server_errors == 0 and not failures, "\n\n".join(failures[:20])
