"""The image aggregate (`domain/image`): the fleet's one build of a recipe — a claim with a
lease, renewals by its holder, a publish that ends it (from any node while nothing is
published, the first digest kept), a failure that frees it, a forget back to empty."""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta

import pytest
from pydantic import ValidationError

from bus.subjects import encode_id
from domain import Conflict, CorruptHistory, Invalid
from domain import image as im
from tests.unit.domain.builders import T0, at

RECIPE = hashlib.sha256(b"recipe").hexdigest()
IID = im.image_aggregate_id(RECIPE)
D1 = hashlib.sha256(b"bytes of build 1").hexdigest()
D2 = hashlib.sha256(b"bytes of build 2").hexdigest()


def step(state: im.Image | None, command: im.AnyImageCommand) -> im.Image | None:
    return im.fold_image(im.decide_image(state, command), state)


def claim(node: str, seconds: float, lease_s: int = 900) -> im.ClaimImageBuild:
    return im.ClaimImageBuild(image_id=IID, node_id=node, lease_s=lease_s, at=at(seconds))


def publish(digest: str = D1, node: str | None = "n1", seconds: float = 60) -> im.PublishImage:
    return im.PublishImage(
        image_id=IID,
        digest=digest,
        stored_bytes=20 << 20,
        size=10 << 30,
        role="root",
        node_id=node,
        at=at(seconds),
    )


def fail(node: str, seconds: float = 30) -> im.FailImageBuild:
    return im.FailImageBuild(image_id=IID, node_id=node, reason="mkfs: no space", at=at(seconds))


def claimed(node: str = "n1") -> im.Image:
    s = step(None, claim(node, 0))
    assert s is not None and s.claim is not None
    return s


def published(digest: str = D1) -> im.Image:
    s = step(claimed(), publish(digest))
    assert s is not None and s.published is not None
    return s


class TestId:
    def test_the_id_is_the_recipes_prefix_and_a_subject_token(self) -> None:
        assert IID.removeprefix("rcp-") == RECIPE[:40]
        assert encode_id(IID) == IID  # its own token: the subject reads as the id

    @pytest.mark.parametrize("bad", ["", "abc", RECIPE.upper(), f"{RECIPE[:39]}.", "g" * 64])
    def test_a_recipe_digest_must_be_hex(self, bad: str) -> None:
        with pytest.raises(Invalid):
            im.image_aggregate_id(bad)

    def test_a_command_refuses_an_id_that_is_no_recipe(self) -> None:
        with pytest.raises(ValidationError):
            im.ClaimImageBuild(image_id="rcp-x.y", node_id="n1")


class TestClaim:
    def test_a_first_claim_is_granted_for_its_lease(self) -> None:
        s = claimed()
        assert s.claim == im.ImageClaim(node_id="n1", since=T0, until=at(900))
        assert s.status == "claimed" and s.holder_at(at(899)) == s.claim
        assert s.holder_at(at(900)) is None

    def test_a_second_node_is_refused_while_the_lease_is_live(self) -> None:
        with pytest.raises(im.ClaimHeld) as refused:
            im.decide_image(claimed("n1"), claim("n2", 899))
        assert (refused.value.holder, refused.value.until) == ("n1", at(900))
        assert isinstance(refused.value, Conflict)  # a refusal, as any other conflict

    def test_a_lease_run_out_is_anyones(self) -> None:
        s = step(claimed("n1"), claim("n2", 900))
        assert s is not None and s.claim == im.ImageClaim(
            node_id="n2", since=at(900), until=at(1800)
        )

    def test_the_holder_claiming_again_renews(self) -> None:
        s = step(claimed("n1"), claim("n1", 600))
        assert s is not None and s.claim == im.ImageClaim(node_id="n1", since=T0, until=at(1500))
        with pytest.raises(im.ClaimHeld):  # the renewal holds the others off past 900
            im.decide_image(s, claim("n2", 1200))

    def test_the_holder_renews_after_its_lease_ran_out_if_nobody_took_it(self) -> None:
        s = step(claimed("n1"), claim("n1", 1000))
        assert s is not None and s.claim is not None and s.claim.until == at(1900)

    def test_a_redelivered_claim_decides_nothing(self) -> None:
        c = claim("n1", 0)
        s = step(None, c)
        assert im.decide_image(s, c) == []

    def test_two_nodes_racing_on_one_version_get_one_claim(self) -> None:
        """Both decide on the same (empty) state; the log's optimistic concurrency lets one
        append, and the loser decides again on the state after it: refused."""
        first, second = claim("n1", 0), claim("n2", 0.1)
        assert im.decide_image(None, first) and im.decide_image(None, second)
        after = step(None, first)
        with pytest.raises(im.ClaimHeld):
            im.decide_image(after, second)

    def test_a_claim_once_published_answers_its_digest(self) -> None:
        with pytest.raises(im.AlreadyPublished) as answered:
            im.decide_image(published(), claim("n2", 5000))
        assert answered.value.digest == D1


class TestPublish:
    def test_the_holders_publish_ends_the_claim(self) -> None:
        s = published()
        assert s.claim is None and s.status == "published"
        assert s.published == im.PublishedImage(
            digest=D1, stored_bytes=20 << 20, size=10 << 30, role="root", node_id="n1", at=at(60)
        )

    def test_publishing_the_same_bytes_again_decides_nothing(self) -> None:
        assert im.decide_image(published(), publish(D1, node="n2", seconds=99)) == []

    def test_other_bytes_are_refused_and_the_first_kept(self) -> None:
        with pytest.raises(im.AlreadyPublished) as refused:
            im.decide_image(published(D1), publish(D2, node="n2"))
        assert refused.value.digest == D1

    def test_a_node_without_the_claim_may_publish_first(self) -> None:
        """n1's lease ran out and n2 took it, yet n1 finished: its bytes are as good."""
        s = step(step(claimed("n1"), claim("n2", 1000)), publish(D1, node="n1", seconds=1100))
        assert s is not None and s.published is not None and s.published.node_id == "n1"
        assert s.claim is None

    def test_publish_without_any_claim(self) -> None:
        s = step(None, publish())
        assert s is not None and s.status == "published"

    def test_publish_after_a_failure(self) -> None:
        s = step(step(claimed("n1"), fail("n1")), publish(D2, node="n1", seconds=90))
        assert s is not None and s.published is not None and s.published.digest == D2
        assert s.last_failure is not None  # kept: what happened before

    def test_a_digest_must_be_sha256_hex(self) -> None:
        with pytest.raises(ValidationError):
            publish("sha256:" + D1)


class TestFail:
    def test_a_failed_build_frees_the_claim(self) -> None:
        s = step(claimed("n1"), fail("n1"))
        assert s is not None and s.claim is None and s.status == "failed"
        assert s.last_failure == im.ImageFailure(node_id="n1", reason="mkfs: no space", at=at(30))
        s2 = step(s, claim("n2", 31))
        assert s2 is not None and s2.claim is not None and s2.claim.node_id == "n2"

    def test_a_failure_from_a_node_that_lost_the_claim_is_moot(self) -> None:
        taken = step(claimed("n1"), claim("n2", 1000))
        assert im.decide_image(taken, fail("n1", 1001)) == []

    def test_a_failure_after_the_publish_or_before_any_claim_is_moot(self) -> None:
        assert im.decide_image(published(), fail("n1", 70)) == []
        assert im.decide_image(None, fail("n1")) == []

    def test_the_holder_fails_after_its_lease_ran_out(self) -> None:
        s = step(claimed("n1"), fail("n1", 2000))
        assert s is not None and s.claim is None


class TestForget:
    def forget(self, seconds: float) -> im.ForgetImage:
        return im.ForgetImage(image_id=IID, at=at(seconds))

    def test_forget_returns_to_empty_naming_the_digest(self) -> None:
        events = im.decide_image(published(), self.forget(100))
        assert [type(e) for e in events] == [im.ImageForgotten]
        assert isinstance(events[0], im.ImageForgotten) and events[0].digest == D1
        s = im.fold_image(events, published())
        assert s is not None and s.status == "empty"
        assert (s.claim, s.published, s.last_failure) == (None, None, None)
        again = step(s, claim("n2", 101))  # built again on next use
        assert again is not None and again.claim is not None

    def test_forgetting_nothing_decides_nothing(self) -> None:
        assert im.decide_image(None, self.forget(0)) == []
        s = step(published(), self.forget(100))
        assert im.decide_image(s, self.forget(101)) == []

    def test_a_build_in_progress_is_not_forgotten(self) -> None:
        with pytest.raises(im.ClaimHeld):
            im.decide_image(claimed(), self.forget(10))
        s = step(claimed(), self.forget(900))  # its lease ran out: a stale claim goes
        assert s is not None and s.status == "empty"


class TestEvolve:
    def test_a_forget_or_failure_of_nothing_is_corrupt(self) -> None:
        cid = uuid.uuid4()
        with pytest.raises(CorruptHistory):
            im.evolve_image(None, im.ImageForgotten(image_id=IID, command_id=cid, at=T0))
        with pytest.raises(CorruptHistory):
            im.evolve_image(
                None,
                im.ImageBuildFailed(image_id=IID, command_id=cid, node_id="n", reason="x", at=T0),
            )

    def test_commands_are_remembered_for_a_while(self) -> None:
        s: im.Image | None = claimed()
        for i in range(1, 20):
            s = step(s, claim("n1", i))
        assert s is not None and len(s.recent_commands) == 16

    def test_lease_arithmetic_uses_the_commands_clock(self) -> None:
        s = step(None, claim("n1", 0, lease_s=60))
        assert s is not None and s.claim is not None
        assert s.claim.until - s.claim.since == timedelta(seconds=60)
