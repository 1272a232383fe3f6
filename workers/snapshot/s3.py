"""`S3Store`: snapshots in an S3 bucket (SeaweedFS locally, any S3 in production).

Large blobs go up as multipart uploads read part by part from the file, a few parts in
flight, so memory stays bounded (~`PART_SIZE * PART_CONCURRENCY`) whatever the layer's size.
Downloads stream to disk in 1 MiB pieces, hashed on the way. botocore's own retries are
off: the repository retries `RetryableStoreError`s with its own backoff, and a rejected
credential should fail at once rather than after three silent attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aioboto3
from aiobotocore.config import AioConfig
from botocore.exceptions import BotoCoreError, ClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from workers.snapshot import paths
from workers.snapshot.digest import IO_CHUNK, VerifyingWriter
from workers.snapshot.errors import BlobNotFound, ManifestNotFound, RetryableStoreError, StoreError
from workers.snapshot.store import BlobInfo, BlobSource

# S3 needs parts of >= 5 MiB (but the last); 8 MiB x 4 in flight keeps RSS ~32 MiB per upload.
PART_SIZE = 8 << 20
PART_CONCURRENCY = 4
MULTIPART_THRESHOLD = 16 << 20

_AUTH_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"}
_TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
    "502",
    "504",
}
_MISSING_CODES = {"404", "NoSuchKey", "NotFound"}
# Failures below the S3 protocol (sockets, timeouts); _error decides which are transient.
_DRIVER_ERRORS = (BotoCoreError, OSError, TimeoutError)


@dataclass(frozen=True)
class S3Config:
    """Where and as whom: an endpoint (None = AWS), credentials, a bucket and a key prefix."""

    bucket: str
    endpoint_url: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    region: str = "us-east-1"
    prefix: str = ""
    create_bucket: bool = True


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _status(e: ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


class S3Store:
    """A `SnapshotStore` over one S3 bucket. Create with `await S3Store.open(config)`."""

    def __init__(self, config: S3Config, client: Any, stack: contextlib.AsyncExitStack):
        self.config = config
        self.prefix = config.prefix
        self._s3 = client
        self._stack = stack

    @classmethod
    async def open(cls, config: S3Config) -> S3Store:
        """Connect, check the credentials, and create the bucket if it is missing."""
        stack = contextlib.AsyncExitStack()
        session = aioboto3.Session()
        client = await stack.enter_async_context(
            session.client(
                "s3",
                endpoint_url=config.endpoint_url,
                aws_access_key_id=config.access_key,
                aws_secret_access_key=config.secret_key,
                region_name=config.region,
                config=AioConfig(
                    retries={"total_max_attempts": 1},
                    connect_timeout=5,
                    read_timeout=60,
                    max_pool_connections=16,
                    s3={"addressing_style": "path"},
                    # Non-AWS S3s differ in flexible-checksum support; digests cover integrity.
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                ),
            )
        )
        store = cls(config, client, stack)
        try:
            await store._ensure_bucket()
        except BaseException:
            await stack.aclose()
            raise
        return store

    async def close(self) -> None:
        await self._stack.aclose()

    def _error(self, e: Exception, what: str) -> StoreError:
        where = f"S3 {self.config.endpoint_url or 'aws'} bucket {self.config.bucket!r}"
        if isinstance(e, ClientError):
            code, status = _code(e), _status(e)
            if code in _AUTH_CODES or status == 403:
                return StoreError(
                    f"{where}: {what}: access denied ({code or status}) — check the access key "
                    f"{self.config.access_key!r} and its secret, and the key's permissions"
                )
            if code in _TRANSIENT_CODES or status >= 500 or status == 429:
                return RetryableStoreError(f"{where}: {what}: transient error {code or status}")
            return StoreError(f"{where}: {what}: {code or status}: {e}")
        if isinstance(e, (BotoConnectionError, TimeoutError, OSError)):
            return RetryableStoreError(f"{where}: {what}: connection failed: {e}")
        return StoreError(f"{where}: {what}: {e}")

    async def _ensure_bucket(self) -> None:
        bucket = self.config.bucket
        try:
            await self._s3.head_bucket(Bucket=bucket)
            return
        except ClientError as e:
            if not (_code(e) in _MISSING_CODES or _code(e) == "NoSuchBucket"):
                raise self._error(e, "open") from e
            if not self.config.create_bucket:
                raise StoreError(f"S3 bucket {bucket!r} does not exist") from e
        except _DRIVER_ERRORS as e:
            raise self._error(e, "open") from e
        try:
            await self._s3.create_bucket(Bucket=bucket)
        except ClientError as e:
            if _code(e) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise self._error(e, "create bucket") from e
        except _DRIVER_ERRORS as e:
            raise self._error(e, "create bucket") from e

    async def has_blob(self, digest: str) -> bool:
        key = paths.blob_key(digest, self.prefix)
        try:
            head = await self._s3.head_object(Bucket=self.config.bucket, Key=key)
        except ClientError as e:
            if _code(e) in _MISSING_CODES:
                return False
            raise self._error(e, f"head blob {digest}") from e
        except _DRIVER_ERRORS as e:
            raise self._error(e, f"head blob {digest}") from e
        return paths.complete_size(digest, int(head.get("ContentLength", 0)))

    async def put_blob(self, digest: str, source: BlobSource) -> None:
        key = paths.blob_key(digest, self.prefix)
        try:
            if isinstance(source, bytes):
                await self._s3.put_object(Bucket=self.config.bucket, Key=key, Body=source)
                return
            size = os.stat(source).st_size
            if size <= MULTIPART_THRESHOLD:
                body = await asyncio.to_thread(source.read_bytes)
                await self._s3.put_object(Bucket=self.config.bucket, Key=key, Body=body)
                return
            await self._multipart(key, source, size)
        except StoreError:
            raise
        except (ClientError, *_DRIVER_ERRORS) as e:
            raise self._error(e, f"put blob {digest}") from e

    async def _multipart(self, key: str, source: Path, size: int) -> None:
        bucket = self.config.bucket
        up = await self._s3.create_multipart_upload(Bucket=bucket, Key=key)
        upload_id = up["UploadId"]
        n_parts = -(-size // PART_SIZE)
        etags: dict[int, str] = {}
        next_part = iter(range(1, n_parts + 1))

        async def worker() -> None:
            # Each worker holds one part in memory at a time: bounded RSS.
            fd = await asyncio.to_thread(os.open, source, os.O_RDONLY)
            try:
                for number in next_part:
                    offset = (number - 1) * PART_SIZE
                    body = await asyncio.to_thread(os.pread, fd, PART_SIZE, offset)
                    r = await self._s3.upload_part(
                        Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
                    )
                    etags[number] = r["ETag"]
            finally:
                os.close(fd)

        try:
            async with asyncio.TaskGroup() as tg:
                for _ in range(min(PART_CONCURRENCY, n_parts)):
                    tg.create_task(worker())
            parts = [{"PartNumber": n, "ETag": etags[n]} for n in sorted(etags)]
            await self._s3.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        except BaseException as e:
            # Don't leave invisible parts billing storage. (A killed process still can:
            # production buckets want an AbortIncompleteMultipartUpload lifecycle rule.)
            with contextlib.suppress(Exception):
                await self._s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            if isinstance(e, BaseExceptionGroup):
                first = e.exceptions[0]
                if isinstance(first, Exception):
                    raise first from e
            raise

    async def get_blob_to(self, digest: str, dest: Path) -> int:
        key = paths.blob_key(digest, self.prefix)
        try:
            r = await self._s3.get_object(Bucket=self.config.bucket, Key=key)
        except ClientError as e:
            if _code(e) in _MISSING_CODES:
                raise BlobNotFound(f"S3 bucket {self.config.bucket!r}: no blob {digest}") from e
            raise self._error(e, f"get blob {digest}") from e
        except _DRIVER_ERRORS as e:
            raise self._error(e, f"get blob {digest}") from e
        w = await asyncio.to_thread(VerifyingWriter, dest, digest)
        try:
            body = r["Body"]
            try:
                async for piece in body.iter_chunks(IO_CHUNK):
                    await asyncio.to_thread(w.write, piece)
            finally:
                body.close()
        except BaseException as e:
            await asyncio.to_thread(w.abort)
            if isinstance(e, _DRIVER_ERRORS):
                raise self._error(e, f"read blob {digest}") from e
            raise
        return await asyncio.to_thread(w.commit)

    async def delete_blob(self, digest: str) -> None:
        await self._delete(paths.blob_key(digest, self.prefix), f"delete blob {digest}")

    async def _delete(self, key: str, what: str) -> None:
        try:
            await self._s3.delete_object(Bucket=self.config.bucket, Key=key)
        except ClientError as e:
            if _code(e) not in _MISSING_CODES:
                raise self._error(e, what) from e
        except _DRIVER_ERRORS as e:
            raise self._error(e, what) from e

    async def _list(self, prefix: str) -> AsyncIterator[dict[str, Any]]:
        try:
            pages = self._s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.config.bucket, Prefix=prefix
            )
            async for page in pages:
                for obj in page.get("Contents", []):
                    yield obj
        except (ClientError, *_DRIVER_ERRORS) as e:
            raise self._error(e, f"list {prefix}") from e

    async def iter_blobs(self) -> AsyncIterator[BlobInfo]:
        async for obj in self._list(paths.blobs_root(self.prefix)):
            digest = paths.digest_from_key(obj["Key"], self.prefix)
            if digest is not None:
                yield BlobInfo(digest, int(obj["Size"]), obj["LastModified"])

    async def put_manifest(self, snapshot_id: str, data: bytes) -> None:
        key = paths.manifest_key(snapshot_id, self.prefix)
        try:
            await self._s3.put_object(
                Bucket=self.config.bucket, Key=key, Body=data, ContentType="application/json"
            )
        except (ClientError, *_DRIVER_ERRORS) as e:
            raise self._error(e, f"put manifest {snapshot_id}") from e

    async def get_manifest(self, snapshot_id: str) -> bytes:
        key = paths.manifest_key(snapshot_id, self.prefix)
        try:
            r = await self._s3.get_object(Bucket=self.config.bucket, Key=key)
            body = r["Body"]
            try:
                data: bytes = await body.read()
            finally:
                body.close()
            return data
        except ClientError as e:
            if _code(e) in _MISSING_CODES:
                raise ManifestNotFound(f"S3: no manifest for snapshot {snapshot_id}") from e
            raise self._error(e, f"get manifest {snapshot_id}") from e
        except _DRIVER_ERRORS as e:
            raise self._error(e, f"get manifest {snapshot_id}") from e

    async def list_manifests(self) -> list[str]:
        out = []
        async for obj in self._list(paths.manifests_root(self.prefix)):
            sid = paths.snapshot_id_from_key(obj["Key"], self.prefix)
            if sid is not None:
                out.append(sid)
        return sorted(out)

    async def delete_manifest(self, snapshot_id: str) -> None:
        key = paths.manifest_key(snapshot_id, self.prefix)
        await self._delete(key, f"delete manifest {snapshot_id}")
