"""Ephemeral keys: minted with a TTL in OpenAI's bounds, found until they expire, at most
``max_keys`` alive (the one closest to expiry goes first), and never shown in a repr."""

from __future__ import annotations

import pytest

from server.auth import AccessPolicy
from server.client_secrets import ClientSecretError, ClientSecrets


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_keys_expire_are_bounded_and_are_checked_by_the_access_policy() -> None:
    """Expiry on a fake clock, the bound, the mint's refusals, and the policy's view of a live
    and of a stale key (with and without real keys set)."""
    clock = Clock()
    keys = ClientSecrets(3, clock)
    short = keys.mint({"expires_after": {"anchor": "created_at", "seconds": 10}}, owner="o")
    assert short.value.startswith("ek_") and short.expires_at == 1_010 and keys.find(short.value) == short
    assert short.value not in repr(short)
    clock.now = 1_010
    assert keys.find(short.value) is None and len(keys) == 0
    made = [keys.mint({"expires_after": {"seconds": 100 + i}, "session": {"instructions": str(i)}}, "o") for i in range(4)]
    assert len(keys) == 3 and keys.find(made[0].value) is None  # the soonest to expire went
    assert keys.find(made[3].value).session == {"instructions": "3"}
    for bad in [{"expires_after": {"seconds": 9}}, {"expires_after": {"seconds": 7201}}, {"expires_after": {"seconds": True}},
                {"expires_after": {"anchor": "now"}}, {"expires_after": 5}, {"session": "x"}]:
        with pytest.raises(ClientSecretError):
            keys.mint(bad, "o")
    policy = AccessPolicy(["real"], [], keys)
    ek = {"authorization": f"Bearer {made[3].value}"}
    assert policy.http_key(ek, {}) and not policy.real_key(ek, {}) and policy.real_key({"x-api-key": "real"}, {})
    assert policy.owner(ek, {}) == "o"
    assert policy.check({}, {}, ["realtime", f"openai-insecure-api-key.{made[3].value}"]).refusal is None
    clock.now += 1_000
    assert not policy.http_key(ek, {}) and policy.check({}, {}, [f"openai-insecure-api-key.{made[3].value}"]).refusal
    open_policy = AccessPolicy([], [], keys)  # no keys needed, but a stale ephemeral one is still refused
    assert open_policy.http_key({}, {}) and not open_policy.http_key(ek, {})
