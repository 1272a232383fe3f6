"""An image's read trace, pure: what a recording keeps (first-touch order, its window, its
limit), what a prefetch plans from it, and how the repository names and reads it (a trace
names no blob; its id is its image's beside it; a trace without its image is an orphan)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from workers.snapshot import paths
from workers.snapshot.blocks.trace import PlannedChunk, TraceRecorder, prefetch_plan
from workers.snapshot.leftovers import orphan_traces
from workers.snapshot.manifest import MemoryRef, TraceManifest, parse_manifest

A, B, C = "a" * 64, "b" * 64, "c" * 64


def test_a_recording_keeps_first_touches_in_order_once_each() -> None:
    r = TraceRecorder(started=100.0, window_s=30, limit=10)
    r.touch([7, 8], now=100.0)
    r.touch([2], now=101.0)
    r.touch([8, 7, 3], now=102.0)  # read again: keeps its first place
    assert r.chunks == (7, 8, 2, 3)
    assert not r.done(now=129.9)


def test_a_recording_ends_with_its_window() -> None:
    r = TraceRecorder(started=100.0, window_s=2, limit=10)
    r.touch([1], now=101.9)
    r.touch([2], now=102.0)  # the window is over: not recorded
    assert r.chunks == (1,) and r.done(now=102.0)


def test_a_recording_stops_at_its_limit_even_inside_one_read() -> None:
    r = TraceRecorder(started=0.0, window_s=30, limit=3)
    full: list[tuple[int, ...]] = []
    r.on_full = lambda: full.append(r.chunks)
    r.touch([5, 6], now=1)
    r.touch([6, 9, 10, 11], now=2)
    assert r.chunks == (5, 6, 9) and r.done(now=3)
    r.touch([12], now=3)
    assert r.chunks == (5, 6, 9)
    assert full == [(5, 6, 9)]  # told once, when the third chunk came


def test_a_plan_fetches_each_chunk_with_data_once_in_the_trace_order() -> None:
    # 5 chunks of 4 bytes over 18 bytes: the last is 2 bytes long; chunk 1 is zeros;
    # chunks 0 and 3 hold the same bytes
    disk = MemoryRef(size=18, chunk_size=4, chunks=(A, None, B, A, C))
    plan = prefetch_plan([4, 1, 3, 2, 0, 9, -1, 2], disk)
    assert plan == [PlannedChunk(4, C, 2), PlannedChunk(3, A, 4), PlannedChunk(2, B, 4)]
    assert prefetch_plan([], disk) == []


def test_a_trace_names_no_blob_and_reads_back_as_a_trace() -> None:
    trace = TraceManifest(digest=A, created_at=datetime.now(UTC), window_s=30, chunks=(3, 0, 9))
    again = parse_manifest(trace.to_json())
    assert again == trace and again.blob_digests() == set()
    assert trace.key == f"image-{A}.trace" == paths.trace_key(A)
    with pytest.raises(ValidationError):
        TraceManifest(digest=A, created_at=datetime.now(UTC), window_s=30, chunks=(1, 1))
    with pytest.raises(ValidationError):
        TraceManifest(digest=A, created_at=datetime.now(UTC), window_s=30, chunks=(-1,))


def test_a_trace_id_is_its_images_and_no_image_id() -> None:
    key = paths.trace_key(B)
    assert paths.trace_digest_from_id(key) == B
    assert paths.image_digest_from_id(key) is None  # image listings do not see traces
    assert paths.trace_digest_from_id(paths.image_key(B)) is None
    assert paths.trace_digest_from_id("p-123.trace") is None
    assert paths.snapshot_id_from_key(paths.manifest_key(key)) == key


def test_orphan_traces_are_those_whose_image_is_not_stored() -> None:
    stored = [paths.image_key(A), paths.trace_key(A), paths.trace_key(B), "p-1", "t-x.trace"]
    assert orphan_traces(stored) == [paths.trace_key(B)]
    assert orphan_traces([]) == []
