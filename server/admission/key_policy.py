"""Policy per API key: what each client key may ask of the proxy (FAITHPROXY_POLICY_FILE, YAML).

    default: {modes: [correct, detect]}
    keys:
      - name: mobile-app            # in logs and metrics; the key itself never is
        key_env: MOBILE_APP_KEY     # or key: "..."
        modes: [correct]
        detectors: [judge, cascade]
        judges: [qwen72b]
        retries: {min: 1, max: 5}
        max_judge_budget: 20000
        hints: false
        shadow_share: 0.05          # of its off-mode requests, checked after the fact (server/shadow/checker.py)

Each field limits what a request may ask for; an absent field allows what the server allows. The keys
of the file are valid API keys beside FAITHPROXY_API_KEYS (server/admission/auth.py asks `KeyPolicies.valid`),
which get the `default` policy, as does every request when no key is presented.

Enforcement is one step of admission (server/admission/admit.py calls `KeyPolicies.enforce` on the policy
read from the headers), so every door inherits it. A value outside the policy is a `PolicyForbidden`
(403, OpenAI format) naming the header and the allowed values, whether the header asked for it or the
server's default would have given it; nothing has gone upstream yet. Off mode runs no detector, no
judge, no retry and no hint, so only `modes` limits it. `max_judge_budget` is a ceiling and, when the
request names no budget, the request's budget (as FAITHPROXY_JUDGE_BUDGET_TOKENS is for the server).

`KeyPolicies.reload()` (SIGHUP, installed by the app's lifespan) reads the file again: the new book
replaces the old at once, for the requests admitted after it; a request in flight keeps what it was
admitted with, so no stream is dropped. A file that does not load keeps the old book; the log says
why and faithproxy_policy_reloads_total{result="failed"} counts it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from faithproxy.detectors.registry import DETECTORS, declared_options
from faithproxy.faithcore.errors import PolicyForbidden
from faithproxy.server.admission.policy import (
    HEADER_DETECTOR,
    HEADER_HINTS,
    HEADER_JUDGE,
    HEADER_MAX_RETRIES,
    HEADER_MODE,
    RequestPolicy,
)

log = logging.getLogger(__name__)

DEFAULT_NAME = "default"
BUDGET_SETTING = "judge_budget_tokens"  # the Settings field of the judge budget the detectors declare


class PolicyFileError(ValueError):
    """The policy file cannot be read, is not valid YAML, or does not describe policies."""


class Retries(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min: int = Field(0, ge=0, le=10)
    max: int = Field(10, ge=0, le=10)

    @model_validator(mode="after")
    def _ordered(self) -> Retries:
        if self.min > self.max:
            raise ValueError(f"retries: min {self.min} exceeds max {self.max}")
        return self


class KeyPolicy(BaseModel):
    """What a request may ask for. None: whatever the server allows."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = DEFAULT_NAME
    key: SecretStr | None = None
    key_env: str | None = None
    modes: list[Literal["correct", "detect", "off"]] | None = None
    detectors: list[str] | None = None
    judges: list[str] | None = None
    retries: Retries | None = None
    max_judge_budget: int | None = Field(None, ge=0)
    hints: bool | None = None  # false: no hints
    # The share of this key's off-mode requests checked after the fact; None: FAITHPROXY_SHADOW_SHARE.
    shadow_share: float | None = Field(None, ge=0.0, le=1.0)

    @field_validator("modes", mode="before")
    @classmethod
    def _off_is_a_mode(cls, value: object) -> object:
        """YAML 1.1 reads a bare `off` as false: in a list of modes it is the mode."""
        return (
            [mode_name if mode_name is not False else "off" for mode_name in value]
            if isinstance(value, list)
            else value
        )

    def secret(self) -> str:
        """The key this policy is for (key, or the environment variable key_env names)."""
        if self.key is not None:
            return self.key.get_secret_value()
        value = os.environ.get(self.key_env or "")
        if not value:
            raise ValueError(f"policy {self.name!r}: environment variable {self.key_env!r} is not set")
        return value


class PolicyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default: KeyPolicy = KeyPolicy()
    keys: list[KeyPolicy] = Field(default_factory=list)

    @model_validator(mode="after")
    def _well_formed(self) -> PolicyFile:
        if self.default.key is not None or self.default.key_env is not None:
            raise ValueError("the default policy has no key")
        names = [DEFAULT_NAME] + [policy.name for policy in self.keys]
        if len(set(names)) != len(names):
            raise ValueError(f"policy names must be unique and not {DEFAULT_NAME!r}: {names}")
        for policy in self.keys:
            if (policy.key is None) == (policy.key_env is None):
                raise ValueError(f"policy {policy.name!r}: give exactly one of key and key_env")
        return self


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


@dataclass(frozen=True)
class PolicyBook:
    """A loaded policy file: the default policy and each key's, by the key's SHA-256 digest."""

    default: KeyPolicy
    keyed: tuple[tuple[bytes, KeyPolicy], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return (self.default.name, *(policy.name for _, policy in self.keyed))

    def lookup(self, token: bytes | None) -> KeyPolicy | None:
        """The policy of a key of the file, or None. Constant-time over the keys (as server/admission/auth.py)."""
        if token is None:
            return None
        presented = _digest(token)
        found = None
        for digest, policy in self.keyed:
            if hmac.compare_digest(presented, digest):
                found = policy
        return found


def load_book(path: str) -> PolicyBook:
    """The policy file at `path`, or a PolicyFileError saying what is wrong with it."""
    import yaml  # here: a server without a policy file never loads it

    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
        parsed = PolicyFile.model_validate(raw if raw is not None else {})
        keyed = tuple((_digest(policy.secret().encode()), policy) for policy in parsed.keys)
    except (OSError, yaml.YAMLError, ValidationError, ValueError) as exc:
        raise PolicyFileError(f"policy file {path}: {exc}") from exc
    if len({digest for digest, _ in keyed}) != len(keyed):
        raise PolicyFileError(f"policy file {path}: two policies have the same key")
    return PolicyBook(parsed.default, keyed)


def bearer_token(headers: Mapping[str, str]) -> bytes | None:
    scheme, _, token = headers.get("authorization", "").strip().partition(" ")
    return token.strip().encode() if scheme.lower() == "bearer" and token.strip() else None


class KeyPolicies:
    """The policy book in force, reloadable. `on_reload(result)` and `on_request(policy, outcome)` count
    (server/observe/metrics.py); `on_names(names)` learns the policies' names (to pre-initialise series)."""

    def __init__(
        self,
        path: str,
        *,
        on_reload: Callable[[str], None] | None = None,
        on_request: Callable[[str, str], None] | None = None,
    ) -> None:
        self.path = path
        self.book = load_book(path)  # a broken file at start stops the start
        self.on_reload = on_reload
        self.on_request = on_request

    def reload(self) -> bool:
        """Reads the file again; keeps the book in force when it does not load. True: replaced."""
        try:
            book = load_book(self.path)
        except PolicyFileError as exc:
            log.error("policy reload failed, keeping the policies in force (%s): %s", ", ".join(self.book.names), exc)
            self._count_reload("failed")
            return False
        self.book = book
        log.info("policy reloaded: %s", ", ".join(book.names))
        self._count_reload("ok")
        return True

    def _count_reload(self, result: str) -> None:
        if self.on_reload is not None:
            self.on_reload(result)

    def valid(self, token: bytes) -> bool:
        """A key of the policy file (server/admission/auth.py: beside FAITHPROXY_API_KEYS)."""
        return self.book.lookup(token) is not None

    def has_keys(self) -> bool:
        return bool(self.book.keyed)

    def policy_for(self, headers: Mapping[str, str]) -> KeyPolicy:
        return self.book.lookup(bearer_token(headers)) or self.book.default

    def enforce(self, headers: Mapping[str, str], policy: RequestPolicy) -> tuple[str, RequestPolicy]:
        """(the key policy's name, the request's policy within it), or PolicyForbidden (403)."""
        limits, policy = self.admit(headers, policy)
        return limits.name, policy

    def admit(self, headers: Mapping[str, str], policy: RequestPolicy) -> tuple[KeyPolicy, RequestPolicy]:
        """`enforce`, handing back the key's whole policy (its shadow share too)."""
        limits = self.policy_for(headers)
        try:
            policy = within(limits, headers, policy)
        except PolicyForbidden:
            self._count(limits.name, "refused")
            raise
        self._count(limits.name, "admitted")
        return limits, policy

    def _count(self, name: str, outcome: str) -> None:
        if self.on_request is not None:
            self.on_request(name, outcome)


# ---- the checks: each field of a KeyPolicy against the request's value ---------------------------


def _forbidden(limits: KeyPolicy, header: str, headers: Mapping[str, str], value: Any, allowed: str) -> None:
    asked = f"asks for '{value}'" if header in headers else f"is absent and the server's default is '{value}'"
    raise PolicyForbidden(
        f"Header {header} {asked}, which the policy '{limits.name}' of this API key does not allow. "
        f"Allowed: {allowed}.",
        param=header,
    )


def _check_choice(
    limits: KeyPolicy, header: str, headers: Mapping[str, str], value: Any, allowed: Sequence[str] | None
) -> None:
    if allowed is not None and value not in allowed:
        _forbidden(limits, header, headers, value, ", ".join(allowed) if allowed else "(none)")


def _check_retries(limits: KeyPolicy, headers: Mapping[str, str], policy: RequestPolicy) -> None:
    bounds = limits.retries
    if bounds is not None and policy.mode == "correct" and not bounds.min <= policy.max_retries <= bounds.max:
        _forbidden(limits, HEADER_MAX_RETRIES, headers, policy.max_retries, f"{bounds.min} to {bounds.max}")


def _check_judge(limits: KeyPolicy, headers: Mapping[str, str], policy: RequestPolicy) -> None:
    uses_judge = policy.detector in DETECTORS and DETECTORS.declared(policy.detector, "uses_judge")
    if policy.judge is not None and (uses_judge or HEADER_JUDGE in headers):
        _check_choice(limits, HEADER_JUDGE, headers, policy.judge, limits.judges)


def _budget_within(limits: KeyPolicy, headers: Mapping[str, str], policy: RequestPolicy) -> RequestPolicy:
    """The judge budget at most the policy's: the policy's when the request names none."""
    cap = limits.max_judge_budget
    option = next((o for o in declared_options() if o.setting == BUDGET_SETTING), None)
    if cap is None or option is None:
        return policy
    asked = policy.options.get(option.key)
    if option.header in headers and asked is not None and asked > cap:
        _forbidden(limits, option.header, headers, asked, f"0 to {cap}")
    if asked is not None and asked <= cap:
        return policy
    return dataclasses.replace(policy, options={**policy.options, option.key: cap})


def within(limits: KeyPolicy, headers: Mapping[str, str], policy: RequestPolicy) -> RequestPolicy:
    """`policy` (the budget capped by the key policy's), or PolicyForbidden for the first field outside it."""
    _check_choice(limits, HEADER_MODE, headers, policy.mode, limits.modes)
    if policy.mode == "off":  # off runs no detector, judge, retry or hint
        return policy
    _check_choice(limits, HEADER_DETECTOR, headers, policy.detector, limits.detectors)
    _check_judge(limits, headers, policy)
    _check_retries(limits, headers, policy)
    if limits.hints is False and policy.hints:
        _forbidden(limits, HEADER_HINTS, headers, "true", "false")
    return _budget_within(limits, headers, policy)
