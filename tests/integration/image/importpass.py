"""A registry import's steps on the image cache (`$AENV_IMAGE_CACHE`) in a process of its
own: what a crash test kills -9 while it tidies or cleans up.

`python -m tests.integration.image.importpass <ref>` does what `workers.node.imports`
does for a registry image, but the guest image build (which needs a kernel a test machine
may lack): under the import's ledger (`forget_on_failure`), the pull into the shared blob
dir and the unpack through the chain cache, then the finished import's tidy
(`tidy_after_import`). A failed import exits 1 after its cleanup.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from workers.node.image.cache import cache_root
from workers.node.image.errors import ImageError
from workers.node.image.leftovers import forget_on_failure, tidy_after_import
from workers.node.image.oci import open_layout, unpack
from workers.node.image.registry import parse_reference, pull


def import_steps(ref: str, cache: Path | None = None) -> None:
    root = cache_root(cache)
    with forget_on_failure(root, f"import of {ref} in {root}") as made:
        pulled = pull(parse_reference(ref), cache=root, progress=lambda _: None, made=made)
        with (
            open_layout(pulled.layout, "image", blobs=pulled.blobs) as layout,
            tempfile.TemporaryDirectory(prefix=".tmp-importpass-", dir=root) as tmp,
        ):  # the build's tree: scratch, like `cache.staging`
            unpack(layout, Path(tmp) / "tree", lambda _: None, cache=root / "layers", made=made)
        tidy_after_import(root, made, pulled.layout)


if __name__ == "__main__":
    try:
        import_steps(sys.argv[1])
    except ImageError as e:
        sys.exit(f"import failed: {e}")
