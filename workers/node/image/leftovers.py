"""A failed image import leaves nothing (images-at-scale S8, issue 42).

An import that fails — a pull error, a corrupt or truncated layer, an unpack error, mkfs
running out of room, any exception — used to leave what it had made so far: skopeo's
blobs, the layer chains kept before the failure, its OCI layout (a failed 2.3 GiB build
left 3.6 GiB). The build's own scratch (`.tmp-*`: the tree, the partial ext4) was already
removed by `cache.staging`; the rest is shared cache, so it cannot simply be swept.

So the attempt keeps a ledger, `Made`, filled where things are created (`registry.pull`
notes the blobs it wrote and the layout it created, `oci.unpack` the chains it kept). On
failure `forget_on_failure` removes exactly that, minus what another image holds
(`Held`: what every other OCI layout in the cache names — its blobs, and the chains of
its layers — and what the other imports running in this process use, whose layouts may
not be complete yet). Shared base layers an earlier import made were never in the ledger,
so they stay. An import in another process (a separate `python -m workers.node.image`)
that is still pulling a blob this one made is not seen: it fails and cleans up in turn.
The decision (`leftovers`) is pure; reading the holds and removing are the I/O.

An import killed -9 (the node killed mid-import, or while it tidies or cleans up) must not
leave what it made for ever: the ledger dies with the process, and an unremoved chain
looks like any kept base layer. So the ledger has a record in `.tidy/` in the cache (JSON
lines appended and synced as it fills, and a pull's new blobs before skopeo writes them),
and each removal writes its plan there before it starts, replacing the attempt's record;
each record is flocked while its writer lives and deleted when done. A record nobody holds
was cut short: the next import or the node's start finishes it (`finish_interrupted`),
minus what is held by then.

An ENOSPC anywhere in the failure becomes `DiskFull` ("node disk full: ..."), after the
same cleanup: the node worker answers it as `unavailable`, so another node can take it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DiskFull
from .oci_chains import chain_dir, chain_ids

log = logging.getLogger(__name__)

__all__ = [
    "Held",
    "Made",
    "blob_file",
    "disk_full",
    "disk_full_error",
    "finish_interrupted",
    "finished",
    "forget_on_failure",
    "held_by_others",
    "in_use_by_others",
    "leftovers",
    "tidy_after_import",
]


@dataclass(frozen=True)
class Held:
    """What other images in the cache name, so a failed attempt must leave it."""

    blobs: frozenset[str] = frozenset()
    chains: frozenset[str] = frozenset()


#: records of attempts and removals under way, in the cache (`<pid>-<uuid>.json`)
TIDY = ".tidy"


class _Note:
    """One attempt's or one removal's record in `.tidy/`: JSON lines of what it made or
    will remove, appended and synced as it goes (a line torn by a kill is skipped), locked
    while its writer lives (the lock dies with it: a record whose lock is free was cut
    short)."""

    def __init__(self, root: Path) -> None:
        notes = root / TIDY
        notes.mkdir(exist_ok=True)
        self.path = notes / f"{os.getpid()}-{uuid.uuid4().hex}.json"
        tmp = self.path.with_suffix(".tmp")
        self._f = tmp.open("a")
        fcntl.flock(self._f, fcntl.LOCK_EX)
        tmp.rename(self.path)  # visible only once locked (the lock is the inode's)

    @classmethod
    def open(cls, root: Path) -> _Note | None:
        """A new record, or None where none can be written (a full disk): the import or
        its cleanup goes on without one rather than fail for it."""
        try:
            return cls(root)
        except OSError as e:
            log.warning("no record of this import's removals in %s: %s", root, e)
            return None

    def add(
        self, blobs: Iterable[str] = (), chains: Iterable[str] = (), layouts: Iterable[Path] = ()
    ) -> None:
        doc = {
            "blobs": sorted(blobs),
            "chains": sorted(chains),
            "layouts": sorted(map(str, layouts)),
        }
        try:
            self._f.write(json.dumps(doc) + "\n")
            self._f.flush()
            os.fsync(self._f.fileno())
        except OSError as e:  # a full disk: the import fails (or not) for its own reasons
            log.warning("the record %s is incomplete: %s", self.path, e)

    def done(self) -> None:
        """The record goes: what it noted is dealt with (idempotent)."""
        if not self._f.closed:
            self.path.unlink(missing_ok=True)
            self._f.close()

    def release(self) -> None:
        """The record stays for `finish_interrupted` (its writer failed half-way)."""
        self._f.close()


@dataclass
class Made:
    """What one import attempt created in the cache (filled as it goes): blobs by digest
    (`sha256:<hex>`), chains by chain id, OCI layout directories."""

    blobs: set[str] = field(default_factory=set)
    chains: set[str] = field(default_factory=set)
    layouts: set[Path] = field(default_factory=set)
    #: what it reads from the shared cache, made by it or not (its layers, its chains):
    #: while it runs, another attempt's failure must leave these
    uses: Held = field(default_factory=lambda: Held())
    #: the attempt's record in `.tidy/` (`forget_on_failure`): a kill mid-import leaves
    #: what it made found
    journal: _Note | None = field(default=None, compare=False, repr=False)

    def use(self, blobs: Iterable[str] = (), chains: Iterable[str] = ()) -> None:
        """Note blobs and chains this attempt reads."""
        self.uses = Held(self.uses.blobs | set(blobs), self.uses.chains | set(chains))

    def wrote(
        self, blobs: Iterable[str] = (), chains: Iterable[str] = (), layouts: Iterable[Path] = ()
    ) -> None:
        """Note what this attempt created."""
        b, c, lay = set(blobs), set(chains), set(layouts)
        self.blobs |= b
        self.chains |= c
        self.layouts |= lay
        self.expect(b, c, lay)

    def expect(
        self, blobs: Iterable[str] = (), chains: Iterable[str] = (), layouts: Iterable[Path] = ()
    ) -> None:
        """Note, in the record only, what this attempt is about to create (a pull's new
        blobs): killed while it creates them, they are found all the same."""
        b, c, lay = set(blobs), set(chains), set(layouts)
        if self.journal is not None and (b or c or lay):
            self.journal.add(b, c, lay)


def leftovers(made: Made, held: Held) -> Made:
    """What a failed attempt must remove: all it made that no other image holds. A layout
    directory is the attempt's own (one per reference, made by it), so it always goes."""
    return Made(
        blobs=made.blobs - held.blobs,
        chains=made.chains - held.chains,
        layouts=set(made.layouts),
    )


def finished(made: Made, layers: Sequence[str], chains: Sequence[str], held: Held) -> Made:
    """What a finished import removes (issue 42: a 300 MiB image left 3.45x its size, 2x
    of it these): the layout it made, the blobs it wrote but its lower layers' (the next
    image on the same base pulls and unpacks only its own layers), and the chain of its
    whole stack, which only these very bytes — now the root disk — would reuse; never
    what another image holds. `layers` and `chains` go bottom to top."""
    lower = set(layers[:-1])
    top = {chains[-1]} if chains else set()
    return Made(
        blobs={b for b in made.blobs if b not in lower} - held.blobs,
        chains=(made.chains & top) - held.chains,
        layouts=set(made.layouts),
    )


def disk_full(error: BaseException) -> bool:
    """Whether a failure comes from a full disk: an `OSError(ENOSPC)` anywhere in its
    chain of causes, or a tool's message saying so (skopeo, mkfs and cp report it on
    stderr, which reaches us only as text)."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        if "no space left on device" in str(e).lower():
            return True
        e = e.__cause__ or e.__context__
    return False


def blob_file(blobs: Path, digest: str) -> Path:
    """Where a shared blob directory keeps a digest's bytes (`<algo>/<hex>`)."""
    return blobs / digest.replace(":", "/", 1)


def _json(path: Path) -> dict[str, object]:
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path} is not a JSON object")
    return doc


@dataclass(frozen=True)
class _Image:
    """One image a layout's index names, as its blobs say it."""

    manifest: str
    config: str
    layers: list[str]  # bottom to top
    diff_ids: list[str]


def _images(layout: Path, blobs: Path) -> list[_Image]:
    """The images a layout's index names: manifest, config, layers and diff ids each."""
    out = []
    for entry in _json(layout / "index.json").get("manifests") or []:  # type: ignore[attr-defined]
        digest = str(entry["digest"])
        manifest = _json(blob_file(blobs, digest))
        config = str(manifest["config"]["digest"])  # type: ignore[index]
        rootfs = _json(blob_file(blobs, config)).get("rootfs") or {}
        out.append(
            _Image(
                digest,
                config,
                [str(d["digest"]) for d in manifest.get("layers") or []],  # type: ignore[attr-defined]
                [str(d) for d in rootfs.get("diff_ids") or []],  # type: ignore[attr-defined]
            )
        )
    return out


def _layout_holds(layout: Path, blobs: Path) -> tuple[set[str], set[str]]:
    """The blobs and chains one layout names: its manifests, their configs and layers,
    and the chain ids of each config's diff_ids."""
    named: set[str] = set()
    chains: set[str] = set()
    for image in _images(layout, blobs):
        named.update((image.manifest, image.config, *image.layers))
        chains.update(chain_ids(image.diff_ids))
    return named, chains


#: the attempts running in this process (the node imports in threads), by id: what each
#: uses is held against another's failure, even before its layout is complete
_RUNNING: dict[int, Made] = {}
_RUNNING_LOCK = threading.Lock()


def in_use_by_others(mine: Made) -> Held:
    """What the other attempts running in this process use."""
    with _RUNNING_LOCK:
        others = [m.uses for k, m in _RUNNING.items() if k != id(mine)]
    return Held(
        frozenset().union(*(h.blobs for h in others)),
        frozenset().union(*(h.chains for h in others)),
    )


def held_by_others(root: Path, mine: set[Path]) -> Held:
    """What every OCI layout in the cache but `mine` names. A layout that cannot be read
    is one mid-pull or broken; it holds nothing it can name."""
    blobs: set[str] = set()
    chains: set[str] = set()
    oci = root / "oci"
    for layout in sorted(oci.iterdir()) if oci.is_dir() else ():
        if layout in mine or not layout.is_dir():
            continue
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            named, kept = _layout_holds(layout, root / "blobs")
            blobs |= named
            chains |= kept
    return Held(frozenset(blobs), frozenset(chains))


def remove(root: Path, plan: Made, *, supersedes: _Note | None = None) -> None:
    """Remove what `leftovers` decided (what is already gone is no error), its plan noted
    in `.tidy/` meanwhile, so a kill half-way leaves the rest to `finish_interrupted`.
    `supersedes`: the attempt's own record, which this plan replaces once noted."""
    if not (plan.blobs or plan.chains or plan.layouts):
        return
    note = _Note.open(root)
    try:
        if note is not None:
            note.add(plan.blobs, plan.chains, plan.layouts)
        if supersedes is not None:
            supersedes.done()
        _remove(root, plan)
    except BaseException:
        if note is not None:
            note.release()
        raise
    if note is not None:
        note.done()


def finish_interrupted(root: Path) -> int:
    """Finish the removals a killed process cut short in cache `root` (their plans in
    `.tidy/`, unlocked), minus what other images and this process's imports hold now;
    how many. Run at a node's start and each import's (`forget_on_failure`); a plan whose
    remover is alive stays locked, so it is left alone. (An import running in another
    process is not seen, as for a failure's cleanup: see above.)"""
    done = 0
    notes = root / TIDY
    for path in sorted(notes.glob("*.json")) if notes.is_dir() else ():
        try:
            done += _finish(root, path)
        except (OSError, ValueError, KeyError, TypeError) as e:  # the next start retries
            log.warning("finishing the removal planned in %s failed: %s", path, e)
    for tmp in notes.glob("*.tmp") if notes.is_dir() else ():  # killed before its rename
        with contextlib.suppress(OSError), tmp.open() as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            tmp.unlink()
    return done


def _finish(root: Path, path: Path) -> int:
    try:
        f = path.open()
    except FileNotFoundError:
        return 0  # finished meanwhile
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0  # its remover is alive
        if not path.exists() or path.stat().st_ino != os.fstat(f.fileno()).st_ino:
            return 0  # finished meanwhile (and its name gone with it)
        plan = Made()
        for line in f.read().splitlines():
            try:
                doc = json.loads(line)
            except ValueError:  # torn by the kill
                continue
            plan.blobs |= {str(b) for b in doc["blobs"]}
            plan.chains |= {str(c) for c in doc["chains"]}
            plan.layouts |= {Path(p) for p in doc["layouts"]}
        _remove(root, leftovers(plan, _held(root, plan, plan.layouts)))
        log.info("finished the removal planned in %s, cut short by a kill", path)
        path.unlink()
        return 1


def _remove(root: Path, plan: Made) -> None:
    for digest in plan.blobs:
        blob_file(root / "blobs", digest).unlink(missing_ok=True)
    for chain in plan.chains:
        shutil.rmtree(chain_dir(root / "layers", chain), ignore_errors=True)
    for layout in plan.layouts:
        shutil.rmtree(layout, ignore_errors=True)


def _held(root: Path, made: Made, mine: set[Path]) -> Held:
    """What an attempt must leave: what the cache's other layouts name (`mine` aside) and
    what the other attempts running in this process use."""
    on_disk, running = held_by_others(root, mine), in_use_by_others(made)
    return Held(on_disk.blobs | running.blobs, on_disk.chains | running.chains)


def tidy_after_import(root: Path, made: Made, layout: Path) -> None:
    """After an import into cache `root` built its image: remove what `finished` decides.
    What cannot be read or removed stays (regenerable cache the budget evicts first): the
    import has succeeded, and this must not fail it."""
    try:
        [image] = _images(layout, root / "blobs")  # a layout of one reference: one image
        held = _held(root, made, made.layouts | {layout})
        plan = finished(made, image.layers, chain_ids(image.diff_ids), held)
        remove(root, plan, supersedes=made.journal)
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("tidying after the import of %s failed: %s", layout, e)


@contextlib.contextmanager
def forget_on_failure(root: Path, what: str) -> Iterator[Made]:
    """A ledger for one import attempt into cache `root`; if the body fails, what it made
    goes (see above), and a full disk is raised as `DiskFull` naming `what`."""
    finish_interrupted(root)
    journal = _Note.open(root)
    made = Made(journal=journal)
    with _RUNNING_LOCK:
        _RUNNING[id(made)] = made
    try:
        yield made
    except BaseException as e:
        plan = leftovers(made, _held(root, made, made.layouts))
        remove(root, plan, supersedes=made.journal)
        if isinstance(e, Exception) and disk_full(e) and not isinstance(e, DiskFull):
            raise DiskFull(f"node disk full: {what}: {e}") from e
        raise
    finally:
        if journal is not None:  # ended: what it made is kept, tidied or removed
            journal.done()
        with _RUNNING_LOCK:
            del _RUNNING[id(made)]


@contextlib.contextmanager
def disk_full_error(what: str) -> Iterator[None]:
    """A full disk in the body is raised as `DiskFull` naming `what` (the scratch of a
    build without a ledger — the base image, a runtime disk — goes with `cache.staging`)."""
    try:
        yield
    except Exception as e:
        if disk_full(e) and not isinstance(e, DiskFull):
            raise DiskFull(f"node disk full: {what}: {e}") from e
        raise
