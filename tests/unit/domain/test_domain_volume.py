"""The volume aggregate (every rule of `domain/volume.py`) and what volumes change in the
sandbox's: mounts at create, no fork or snapshot of a sandbox that has them."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from pydantic import ValidationError

from domain import Conflict, CorruptHistory, Invalid, NotFound
from domain import sandbox as sb
from domain import volume as vo
from tests.unit.domain.builders import SID, T0, at, create, running, step

TEAM = "team1"
VID = vo.volume_id_of(TEAM, "data")
TOKEN = hashlib.sha256(b"secret").hexdigest()


def vstep(state: vo.Volume | None, command: vo.AnyVolumeCommand) -> vo.Volume | None:
    return vo.fold_volume(vo.decide_volume(state, command), state)


def created() -> vo.Volume:
    s = vstep(
        None, vo.CreateVolume(volume_id=VID, team_id=TEAM, name="data", token_sha256=TOKEN, at=T0)
    )
    assert s is not None
    return s


def attached(holder: str = "sbxa", node: str | None = "n1") -> vo.Volume:
    s = vstep(created(), vo.AttachVolume(volume_id=VID, holder=holder, node_id=node, at=at(1)))
    assert s is not None and s.holder == holder
    return s


V1 = vo.VolumeVersion(key="vol-a", size_bytes=4096, node_id="n1")


class TestCreateAndDestroy:
    def test_the_id_follows_from_team_and_name(self) -> None:
        assert vo.volume_id_of(TEAM, "data") == VID
        assert vo.volume_id_of("team2", "data") != VID
        assert vo.volume_id_of(TEAM, "other") != VID
        assert len(VID) == 20 and VID.isalnum() and VID.islower()

    def test_created_volume_is_free_and_empty(self) -> None:
        s = created()
        assert (s.name, s.team_id, s.token_sha256) == ("data", TEAM, TOKEN)
        assert s.holder is None and s.version is None and not s.destroyed

    def test_a_name_is_unique_per_team(self) -> None:
        again = vo.CreateVolume(volume_id=VID, team_id=TEAM, name="data", token_sha256=TOKEN)
        with pytest.raises(Conflict, match="already exists"):
            vo.decide_volume(created(), again)

    def test_a_redelivered_create_decides_nothing(self) -> None:
        cmd = vo.CreateVolume(volume_id=VID, team_id=TEAM, name="data", token_sha256=TOKEN)
        s = vstep(None, cmd)
        assert vo.decide_volume(s, cmd) == []

    @pytest.mark.parametrize("name", ["", "-x", "a/b", "a b", "x" * 64, "é"])
    def test_bad_names_are_refused(self, name: str) -> None:
        with pytest.raises(ValidationError):
            vo.CreateVolume(volume_id=VID, team_id=TEAM, name=name, token_sha256=TOKEN)
        assert not vo.is_volume_name(name)

    def test_destroy_then_gone_then_created_again_as_a_new_incarnation(self) -> None:
        first = created()
        s = vstep(first, vo.DestroyVolume(volume_id=VID, at=at(5)))
        assert s is not None and s.destroyed
        with pytest.raises(NotFound):
            vo.decide_volume(s, vo.DestroyVolume(volume_id=VID))
        with pytest.raises(NotFound):
            vo.decide_volume(s, vo.AttachVolume(volume_id=VID, holder="sbxa"))
        again = vstep(
            s,
            vo.CreateVolume(volume_id=VID, team_id=TEAM, name="data", token_sha256=TOKEN, at=at(6)),
        )
        assert again is not None and not again.destroyed and again.version is None
        assert again.incarnation != first.incarnation

    def test_destroy_while_held_is_a_conflict_naming_the_holder(self) -> None:
        with pytest.raises(Conflict, match="sandbox sbxa"):
            vo.decide_volume(attached(), vo.DestroyVolume(volume_id=VID))

    def test_destroy_of_nothing_is_not_found(self) -> None:
        with pytest.raises(NotFound):
            vo.decide_volume(None, vo.DestroyVolume(volume_id=VID))


class TestAttach:
    def test_attach_is_exclusive(self) -> None:
        s = attached("sbxa")
        with pytest.raises(Conflict, match="in use by sandbox sbxa"):
            vo.decide_volume(s, vo.AttachVolume(volume_id=VID, holder="sbxb", node_id="n2"))

    def test_a_content_write_is_named_as_such(self) -> None:
        s = attached(vo.CONTENT_HOLDER_PREFIX + "abc")
        with pytest.raises(Conflict, match="volume API"):
            vo.decide_volume(s, vo.AttachVolume(volume_id=VID, holder="sbxb"))

    def test_the_same_holder_again_is_a_no_op(self) -> None:
        s = attached("sbxa", "n1")
        same = vo.AttachVolume(volume_id=VID, holder="sbxa", node_id="n1")
        assert vo.decide_volume(s, same) == []
        assert vo.decide_volume(s, vo.AttachVolume(volume_id=VID, holder="sbxa")) == []

    def test_the_same_holder_from_another_node_moves_it(self) -> None:
        s = vstep(
            attached("sbxa", "n1"), vo.AttachVolume(volume_id=VID, holder="sbxa", node_id="n2")
        )
        assert s is not None and (s.holder, s.holder_node) == ("sbxa", "n2")

    def test_a_holder_found_gone_can_be_replaced(self) -> None:
        take = vo.AttachVolume(volume_id=VID, holder="sbxb", node_id="n2", replaces="sbxa")
        events = vo.decide_volume(attached("sbxa"), take)
        assert isinstance(events[0], vo.VolumeAttached) and events[0].replaced == "sbxa"
        # but only the holder the caller found gone
        wrong = take.model_copy(update={"replaces": "sbxz"})
        with pytest.raises(Conflict):
            vo.decide_volume(attached("sbxa"), wrong)

    def test_attach_of_a_volume_that_never_existed_is_not_found(self) -> None:
        with pytest.raises(NotFound):
            vo.decide_volume(None, vo.AttachVolume(volume_id=VID, holder="sbxa"))


class TestRelease:
    def test_release_records_the_new_version_and_frees_it(self) -> None:
        rel = vo.ReleaseVolume(volume_id=VID, holder="sbxa", node_id="n1", version=V1, at=at(9))
        s = vstep(attached(), rel)
        assert s is not None and s.holder is None and s.version == V1
        # and now another sandbox may take it
        s = vstep(s, vo.AttachVolume(volume_id=VID, holder="sbxb", node_id="n2"))
        assert s is not None and s.holder == "sbxb" and s.version == V1

    def test_a_release_without_a_version_keeps_the_last_one(self) -> None:
        s = vstep(
            attached(), vo.ReleaseVolume(volume_id=VID, holder="sbxa", node_id="n1", version=V1)
        )
        s = vstep(s, vo.AttachVolume(volume_id=VID, holder="sbxb", node_id="n2"))
        s = vstep(s, vo.ReleaseVolume(volume_id=VID, holder="sbxb", node_id="n2"))
        assert s is not None and s.holder is None and s.version == V1

    def test_a_release_by_someone_else_is_moot(self) -> None:
        s = attached("sbxa")
        assert vo.decide_volume(s, vo.ReleaseVolume(volume_id=VID, holder="sbxb")) == []
        assert vo.decide_volume(created(), vo.ReleaseVolume(volume_id=VID, holder="sbxa")) == []
        assert vo.decide_volume(None, vo.ReleaseVolume(volume_id=VID, holder="sbxa")) == []

    def test_a_stale_nodes_release_is_moot(self) -> None:
        moved = vstep(
            attached("sbxa", "n1"), vo.AttachVolume(volume_id=VID, holder="sbxa", node_id="n2")
        )
        stale = vo.ReleaseVolume(volume_id=VID, holder="sbxa", node_id="n1", version=V1)
        assert vo.decide_volume(moved, stale) == []

    def test_a_release_on_the_holders_behalf_is_forced(self) -> None:
        events = vo.decide_volume(attached(), vo.ReleaseVolume(volume_id=VID, holder="sbxa"))
        assert isinstance(events[0], vo.VolumeReleased) and events[0].forced

    def test_a_redelivered_release_decides_nothing(self) -> None:
        rel = vo.ReleaseVolume(volume_id=VID, holder="sbxa", node_id="n1", version=V1)
        s = vstep(attached(), rel)
        s = vstep(s, vo.AttachVolume(volume_id=VID, holder="sbxa", node_id="n1"))
        assert vo.decide_volume(s, rel) == []  # the same command id: already had its effect


class TestFold:
    def test_events_before_the_create_are_corrupt(self) -> None:
        with pytest.raises(CorruptHistory):
            vo.evolve_volume(
                None, vo.VolumeDestroyed(volume_id=VID, command_id=uuid.uuid4(), at=T0)
            )

    def test_a_second_create_without_a_destroy_is_corrupt(self) -> None:
        event = vo.VolumeCreated(
            volume_id=VID,
            command_id=uuid.uuid4(),
            team_id=TEAM,
            name="data",
            token_sha256=TOKEN,
            at=T0,
        )
        with pytest.raises(CorruptHistory):
            vo.evolve_volume(created(), event)

    def test_a_sandbox_event_is_not_a_volume_event(self) -> None:
        with pytest.raises(CorruptHistory):
            vo.evolve_volume(created(), sb.SandboxKilled(sandbox_id=SID, at=T0))


MOUNT = sb.VolumeMount(name="data", path="/mnt/data", volume_id=VID)


class TestSandboxMounts:
    def test_a_create_keeps_its_mounts(self) -> None:
        s = running(volume_mounts=[MOUNT])
        assert s.volume_mounts == (MOUNT,)

    def test_too_many_mounts(self) -> None:
        mounts = [
            sb.VolumeMount(name=f"v{i}", path=f"/mnt/{i}", volume_id=vo.volume_id_of(TEAM, f"v{i}"))
            for i in range(sb.MAX_VOLUME_MOUNTS + 1)
        ]
        with pytest.raises(Invalid, match="at most"):
            sb.decide(None, create(volume_mounts=mounts))

    @pytest.mark.parametrize("path", ["mnt", "/", "/mnt/../etc", "/mnt//data", "/mnt/data/"])
    def test_bad_paths(self, path: str) -> None:
        with pytest.raises(Invalid):
            sb.decide(None, create(volume_mounts=[MOUNT.model_copy(update={"path": path})]))

    def test_one_path_one_volume(self) -> None:
        other = sb.VolumeMount(name="b", path="/mnt/data", volume_id=vo.volume_id_of(TEAM, "b"))
        with pytest.raises(Invalid, match="same path"):
            sb.decide(None, create(volume_mounts=[MOUNT, other]))
        inside = other.model_copy(update={"path": "/mnt/data/b"})
        with pytest.raises(Invalid, match="inside"):
            sb.decide(None, create(volume_mounts=[MOUNT, inside]))
        twice = MOUNT.model_copy(update={"path": "/mnt/b"})
        with pytest.raises(Invalid, match="once"):
            sb.decide(None, create(volume_mounts=[MOUNT, twice]))

    def test_no_fork_and_no_snapshot_of_a_sandbox_with_volumes(self) -> None:
        s = running(volume_mounts=[MOUNT])
        with pytest.raises(Conflict, match="volumes mounted"):
            sb.decide(s, sb.ForkSandbox(sandbox_id=SID, count=1))
        with pytest.raises(Conflict, match="volumes mounted"):
            sb.decide(s, sb.SnapshotSandbox(sandbox_id=SID, snapshot_id="snap:v1"))

    def test_pause_resume_and_kill_keep_working(self) -> None:
        s = running(volume_mounts=[MOUNT])
        s = step(s, sb.PauseSandbox(sandbox_id=SID, at=at(10)))
        s = step(s, sb.CompletePause(sandbox_id=SID, snapshot_id="p1", at=at(11)))
        s = step(s, sb.ResumeSandbox(sandbox_id=SID, at=at(20)))
        s = step(s, sb.CompleteResume(sandbox_id=SID, node_id="n1", at=at(21)))
        s = step(s, sb.KillSandbox(sandbox_id=SID, at=at(30)))
        s = step(s, sb.CompleteKill(sandbox_id=SID, at=at(31)))
        assert s is not None and s.status is sb.SandboxStatus.KILLED
        assert s.volume_mounts == (MOUNT,)

    def test_a_request_from_before_volumes_has_none(self) -> None:
        s = running()
        assert s.volume_mounts == ()
