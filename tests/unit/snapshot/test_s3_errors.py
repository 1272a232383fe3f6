"""How `S3Store` classifies driver errors: the retry decision rides on the type."""

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from workers.snapshot import RetryableStoreError, S3Config, S3Store, StoreError

STORE = S3Store(S3Config(bucket="b", endpoint_url="http://s3", access_key="AK"), None, None)  # type: ignore[arg-type]


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


@pytest.mark.parametrize(
    ("code", "status"),
    [("SlowDown", 503), ("InternalError", 500), ("", 502), ("RequestTimeout", 400), ("x", 429)],
)
def test_server_trouble_is_retryable(code: str, status: int) -> None:
    assert isinstance(STORE._error(client_error(code, status), "put"), RetryableStoreError)


@pytest.mark.parametrize(
    ("code", "status"),
    [("SignatureDoesNotMatch", 403), ("InvalidAccessKeyId", 403), ("AccessDenied", 403)],
)
def test_rejected_credentials_are_permanent_and_say_so(code: str, status: int) -> None:
    err = STORE._error(client_error(code, status), "put")
    assert type(err) is StoreError
    assert "access denied" in str(err) and "'AK'" in str(err)


def test_connection_failures_are_retryable() -> None:
    err = STORE._error(EndpointConnectionError(endpoint_url="http://s3"), "put")
    assert isinstance(err, RetryableStoreError)
    assert isinstance(STORE._error(TimeoutError(), "put"), RetryableStoreError)


def test_other_client_errors_are_permanent() -> None:
    err = STORE._error(client_error("InvalidBucketName", 400), "open")
    assert type(err) is StoreError and "InvalidBucketName" in str(err)
