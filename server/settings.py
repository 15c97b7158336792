"""Server settings: one BaseSettings class, env prefix FAITHPROXY_, nested with `__`.

Judges are configured here and only here (name → backend, model, URL, key); a request can only pick
one by name, never pass a URL or a key.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from clients.judges import JudgeConfig

Mode = Literal["correct", "detect", "off"]
OnDetectorError = Literal["pass", "fail"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FAITHPROXY_", env_nested_delimiter="__", extra="ignore")

    upstream_url: str = "http://127.0.0.1:8000"
    upstream_api_key: SecretStr | None = None
    upstream_connect_timeout_s: float = 10.0
    # Whole-call limit for NON-streamed upstream calls (regeneration, self-checks); streams have none.
    upstream_request_timeout_s: float = 600.0

    host: str = "127.0.0.1"
    port: int = 8080

    # Defaults of the per-request policy (headers override them).
    default_mode: Mode = "correct"
    default_detector: str = "judge"
    default_judge: str | None = None
    max_retries: int = Field(3, ge=0, le=10)  # K of the paper
    on_detector_error: OnDetectorError = "pass"
    annotate: bool = True

    judges: list[JudgeConfig] = Field(default_factory=list)
    regenerator: str = "reflect"
    # Attempt 1 is greedy; later attempts sample at this temperature with a per-attempt seed, since a
    # greedy retry of the same prompt would return the same sentence.
    regeneration_temperature: float = 0.8
    regeneration_max_tokens: int = 128
    # Safety valve: regenerations one request may trigger before unfaithful steps pass uncorrected.
    max_regenerations_per_request: int = 16
    # Most steps sent to the detector in one call when it lags behind decoding.
    max_batch_steps: int = 16
    # True: keep decoding while a step is checked (read-ahead). False: the strictly sequential variant
    # (one step per upstream request, checked before the next is decoded), kept for the benchmark.
    pipelined: bool = True
    think_open_tag: str = "<think>"
    think_close_tag: str = "</think>"

    trace_path: str | None = None

    @field_validator("judges", mode="before")
    @classmethod
    def _judges_from_json(cls, value: object) -> object:
        if isinstance(value, str):
            import json

            return json.loads(value) if value.strip() else []
        return value


@lru_cache
def get_settings() -> Settings:
    return Settings()
