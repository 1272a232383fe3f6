"""The API key aggregate. Keys are stored hashed: sha256 of the key, plus a display prefix.

The plaintext key exists only at the edge that mints it (returned once to the user); the
domain and the log see `key_sha256` and `prefix` only.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from functools import reduce
from typing import ClassVar, assert_never

from pydantic import BaseModel, ConfigDict, Field

from domain.errors import Conflict, CorruptHistory, NotFound
from domain.limits import Limits
from domain.messages import Command, CommandRejected, Event

__all__ = [
    "KEY_PREFIX",
    "AnyApiKeyCommand",
    "AnyApiKeyEvent",
    "ApiKey",
    "ApiKeyCommand",
    "ApiKeyCreated",
    "ApiKeyLimitsSet",
    "ApiKeyRevoked",
    "CreateApiKey",
    "RevokeApiKey",
    "SetApiKeyLimits",
    "decide_api_key",
    "display_prefix",
    "evolve_api_key",
    "fold_api_key",
    "hash_api_key",
    "is_well_formed",
    "new_api_key",
]

#: E2B's keys look like `e2b_<hex>`; ours are recognisable the same way.
# e2b_ + hex: SDKs up to ~2.45 reject any other key format before sending a request.
KEY_PREFIX = "e2b_"
_DISPLAY_LEN = len(KEY_PREFIX) + 6


def hash_api_key(raw: str) -> str:
    """What is stored and compared: hex sha256 (keys are random, so no salt/KDF is needed)."""
    return hashlib.sha256(raw.encode()).hexdigest()


def display_prefix(raw: str) -> str:
    """The first characters, enough for a user to recognise a key in a listing."""
    return raw[:_DISPLAY_LEN]


def new_api_key() -> str:
    """A fresh plaintext key, for the edge that mints it (CLI/API)."""
    return KEY_PREFIX + secrets.token_hex(20)


def is_well_formed(raw: str) -> bool:
    """Whether a key an operator chose would pass the SDKs' own check (`e2b_` + hex) and
    is long enough not to be guessed (at least 128 bits)."""
    body = raw.removeprefix(KEY_PREFIX)
    return (
        raw.startswith(KEY_PREFIX)
        and len(body) >= 32
        and all(c in "0123456789abcdef" for c in body)
    )


class ApiKeyCommand(Command):
    """A command addressed to one API key aggregate."""

    aggregate: ClassVar[str] = "apikey"
    aggregate_field: ClassVar[str] = "key_id"

    key_id: str = Field(min_length=1)


class CreateApiKey(ApiKeyCommand):
    creates: ClassVar[bool] = True
    team_id: str = Field(min_length=1)
    name: str = ""
    prefix: str
    key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class RevokeApiKey(ApiKeyCommand):
    """Revoke a key: it stops authenticating within the API's cache period."""


class SetApiKeyLimits(ApiKeyCommand):
    """Set the admission limits of the key's creates (`domain.limits`): each field given
    overrides the team's and the defaults' for requests with this key; an empty `limits`
    drops every override."""

    limits: Limits = Field(default_factory=Limits)


class ApiKeyCreated(Event):
    key_id: str
    team_id: str
    name: str
    prefix: str
    key_sha256: str


class ApiKeyRevoked(Event):
    key_id: str


class ApiKeyLimitsSet(Event):
    key_id: str
    limits: Limits


class ApiKey(BaseModel):
    model_config = ConfigDict(frozen=True)

    key_id: str
    team_id: str
    name: str
    prefix: str
    key_sha256: str
    revoked: bool = False
    limits: Limits = Field(default_factory=Limits)


#: The closed set of API key commands (`decide_api_key` matches it exhaustively).
AnyApiKeyCommand = CreateApiKey | RevokeApiKey | SetApiKeyLimits


def decide_api_key(state: ApiKey | None, command: AnyApiKeyCommand) -> list[Event]:
    match command:
        case CreateApiKey():
            if state is not None:
                raise Conflict(f"api key {command.key_id} already exists")
            fields = command.model_dump(exclude={"command_id", "at"})
            return [ApiKeyCreated(**fields, at=command.at)]
        case RevokeApiKey():
            if state is None:
                raise NotFound(f"api key {command.key_id} not found")
            if state.revoked:
                return []
            return [ApiKeyRevoked(key_id=command.key_id, at=command.at)]
        case SetApiKeyLimits():
            if state is None:
                raise NotFound(f"api key {command.key_id} not found")
            if state.revoked:
                raise Conflict(f"api key {command.key_id} is revoked")
            if state.limits == command.limits:
                return []
            return [ApiKeyLimitsSet(key_id=command.key_id, limits=command.limits, at=command.at)]
        case _:
            assert_never(command)


#: The closed set of API key events (`evolve_api_key` matches it exhaustively).
AnyApiKeyEvent = ApiKeyCreated | ApiKeyRevoked | ApiKeyLimitsSet


def evolve_api_key(state: ApiKey | None, event: Event) -> ApiKey | None:
    if isinstance(event, CommandRejected):
        return state
    if not isinstance(event, ApiKeyCreated | ApiKeyRevoked | ApiKeyLimitsSet):
        raise CorruptHistory(f"not an API key event: {type(event).__name__}")
    return _evolve_api_key(state, event)


def _evolve_api_key(state: ApiKey | None, event: AnyApiKeyEvent) -> ApiKey | None:
    match event:
        case ApiKeyCreated():
            if state is not None:
                raise CorruptHistory(f"api key {event.key_id} created twice")
            return ApiKey(**event.model_dump(exclude={"at"}))
        case ApiKeyRevoked():
            if state is None:
                raise CorruptHistory(f"api key {event.key_id} revoked before it was created")
            return state.model_copy(update={"revoked": True})
        case ApiKeyLimitsSet():
            if state is None:
                raise CorruptHistory(f"api key {event.key_id} limited before it was created")
            return state.model_copy(update={"limits": event.limits})
        case _:
            assert_never(event)


def fold_api_key(events: Iterable[Event], state: ApiKey | None = None) -> ApiKey | None:
    return reduce(evolve_api_key, events, state)
