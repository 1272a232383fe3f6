import pytest

from workers.snapshot import paths

D = "ab" + "0" * 62


def test_blob_keys_fan_out_by_the_first_two_hex_digits() -> None:
    assert paths.blob_key(D) == f"blobs/sha256/ab/{D}"
    assert paths.blob_key(D, "team/x/") == f"team/x/blobs/sha256/ab/{D}"
    assert paths.blob_key(D, "/team/x") == f"team/x/blobs/sha256/ab/{D}"


def test_manifest_keys() -> None:
    assert paths.manifest_key("snap-1") == "manifests/snap-1.json"
    assert paths.manifest_key("snap-1", "p") == "p/manifests/snap-1.json"


@pytest.mark.parametrize("key", [paths.blob_key(D), paths.blob_key(D, "p")])
def test_keys_parse_back(key: str) -> None:
    prefix = "p" if key.startswith("p/") else ""
    assert paths.digest_from_key(key, prefix) == D


def test_stray_objects_are_not_blobs_or_manifests() -> None:
    assert paths.digest_from_key(f"blobs/sha256/cd/{D}") is None  # wrong fan-out dir
    assert paths.digest_from_key("blobs/sha256/ab/.tmp") is None
    assert paths.digest_from_key(f"other/{D}") is None
    assert paths.snapshot_id_from_key("manifests/x.json.tmp") is None
    assert paths.snapshot_id_from_key("manifests/x.json") == "x"
    assert paths.snapshot_id_from_key("p/manifests/x.json", "p") == "x"


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "x" * 129, "a b"])
def test_unsafe_snapshot_ids_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        paths.manifest_key(bad)


@pytest.mark.parametrize("bad", ["", "AB" + "0" * 62, "0" * 63, "g" * 64])
def test_only_lowercase_sha256_hex_is_a_digest(bad: str) -> None:
    with pytest.raises(ValueError):
        paths.blob_key(bad)


def test_an_image_is_named_by_its_content_digest() -> None:
    key = paths.image_key(D)
    assert key == f"image-{D}" and paths.check_snapshot_id(key) == key
    assert paths.manifest_key(key) == f"manifests/image-{D}.json"
    assert paths.image_digest_from_id(key) == D
    assert paths.image_digest_from_id("snap-1") is None
    assert paths.image_digest_from_id("image-abc") is None  # not a digest
    with pytest.raises(ValueError, match="sha256"):
        paths.image_key("ABC")
