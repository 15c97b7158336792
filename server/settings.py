"""Server settings: one BaseSettings class, env prefix FAITHPROXY_, nested with `__`.

Judges are configured here and only here (name → backend, model, URL, key); a request can only pick
one by name, never pass a URL or a key.

Three kinds of keys never meet: `api_keys` are what clients of the proxy present (checked by
server/admission/auth.py, never forwarded), `upstream_api_key` goes to vLLM only, each judge's key to that judge
only. All are SecretStr: a repr or a log line shows `**********`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from faithproxy.clients.image_fetch import FetchPolicy
from faithproxy.clients.judges import JudgeConfig
from faithproxy.faithcore.reasoning_formats import FORMATS

_MiB = 1024 * 1024

Mode = Literal["correct", "detect", "off"]
OnDetectorError = Literal["pass", "fail"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FAITHPROXY_", env_nested_delimiter="__", extra="ignore")

    upstream_url: str = "http://127.0.0.1:8000"
    upstream_api_key: SecretStr | None = None
    upstream_connect_timeout_s: float = 10.0
    # Whole-call limit for NON-streamed upstream calls (regeneration, self-checks); streams have none,
    # only the idle limit below.
    upstream_request_timeout_s: float = 600.0
    # Longest silence between two reads of an upstream stream (the wait for its headers included) before
    # it counts as stalled; a healthy stream sends a token at least this often, however long it runs.
    # A request queued in vLLM sends nothing until its prefill: raise this if queues get that long.
    # None: wait forever.
    upstream_stream_idle_timeout_s: float | None = Field(300.0, gt=0)
    # How often one correct/detect request goes on after its upstream stream broke mid-round (a replica
    # died, the idle limit): a new round through the same URL continues the verified chain (docs/replicas.md).
    upstream_resume_attempts: int = Field(2, ge=0)
    # The header that carries one routing key on every upstream call of a request (first round, rewrites,
    # continuations, self-checks), so a consistent-hash router keeps the request on one replica: the
    # client's own value when it sent this header, else one made per request. Empty: none is sent.
    routing_header: str = "x-session-id"

    # Bearer keys of the proxy's clients (FAITHPROXY_API_KEYS=key1,key2). Empty: no auth.
    # /healthz and /readyz stay open; /metrics too unless metrics_require_key.
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    # Policy per API key (server/admission/key_policy.py): a YAML file of a default policy and named keys' policies,
    # whose keys are valid API keys beside `api_keys`; reloaded on SIGHUP. None: no per-key policy.
    policy_file: str | None = None
    metrics_require_key: bool = False

    # Limits (see server/admission/limits.py). Bodies and images are counted in bytes.
    max_body_bytes: int = Field(32 * _MiB, gt=0)  # 413
    max_header_bytes: int = Field(32 * 1024, gt=0)  # all header names and values together: 431
    max_images_per_request: int = Field(16, ge=0)  # 400
    max_image_bytes: int = Field(20 * _MiB, gt=0)  # decoded size of one data-URL image: 413
    # Largest max_tokens / max_completion_tokens a request may ask for (more: 400); a request that
    # asks for none gets this as max_tokens. None: no cap (vLLM's context length is the limit).
    max_tokens_cap: int | None = Field(None, gt=0)
    # Chat completions served at once (streams count until their last byte); beyond: 429 + Retry-After.
    max_concurrent_requests: int = Field(512, gt=0)
    retry_after_s: int = Field(1, ge=0)
    # Client timeouts (server/admission/connections.py): the headers, then the whole body, must arrive within
    # these (else 408 and the connection closes); a kept-alive connection idle this long is closed.
    client_header_timeout_s: float = Field(30.0, gt=0)
    client_body_timeout_s: float = Field(30.0, gt=0)
    client_idle_timeout_s: float = Field(5.0, gt=0)
    # Per client (server/admission/limits.py, server/admission/connections.py): requests in flight per API key (else per
    # address), and open connections per address; beyond: 429 + Retry-After. None: no per-client limit
    # (clients behind one NAT or load balancer share an address).
    max_requests_per_client: int | None = Field(None, gt=0)
    max_connections_per_client: int | None = Field(None, gt=0)

    # http(s) image URLs in requests, in every mode (server/admission/image_urls.py): "fetch" them under
    # `image_fetch` and send vLLM and the judge the bytes; "refuse" them (400); or "pass" them to vLLM,
    # only for a vLLM started with --allowed-media-domains.
    image_urls: Literal["fetch", "refuse", "pass"] = "fetch"
    # What the proxy may fetch: client image URLs, and with "pass" those of judges with fetch_images.
    image_fetch: FetchPolicy = Field(default_factory=FetchPolicy)

    host: str = "127.0.0.1"
    port: int = 8080

    # Defaults of the per-request policy (headers override them).
    default_mode: Mode = "correct"
    default_detector: str = "judge"
    default_judge: str | None = None
    max_retries: int = Field(3, ge=0, le=10)  # K of the paper
    on_detector_error: OnDetectorError = "pass"
    annotate: bool = True
    # Judge tokens one request may spend (fresh prompt tokens + cache writes + output; cache reads are
    # free here): past it, perception steps pass unchecked with reason `budget` and the request goes on.
    # None: no limit. X-Faithproxy-Judge-Budget may lower it per request, never raise it.
    judge_budget_tokens: int | None = Field(None, ge=0)
    # Self-consistency for judges without log-probabilities (Anthropic): judge name -> n. A flag is asked
    # n times in all and the share of replies naming the same sentence is its confidence, to which the
    # judge's flag_threshold applies. Costs n - 1 more calls per flag; needs a judge that samples.
    judge_samples: dict[str, int] = Field(default_factory=dict)
    # The judge gate. False (the default): a batch in which the step typer (faithcore/kinds.py) finds no
    # perception step goes to no detector, not even to one that types steps itself (the judge); its steps
    # pass as reasoning, counted in faithproxy_gated_steps_total. True: such detectors get every batch.
    judge_every_step: bool = False

    judges: list[JudgeConfig] = Field(default_factory=list)
    # Collaborative hint inference (server/chain/hints.py): the judge that writes the hints (any configured
    # judge, asked with the question text only), and whether requests get hints without the header.
    hint_judge: str | None = None
    hints_default: bool = False
    regenerator: str = "reflect"
    # Attempt 1 is greedy; later attempts sample at this temperature with a per-attempt seed, since a
    # greedy retry of the same prompt would return the same sentence.
    regeneration_temperature: float = 0.8
    regeneration_max_tokens: int = 128
    # Rewrites sampled per try (vLLM's `n`); of those that are neither the flagged sentence nor a
    # rejected rewrite, the one most samples agree on is checked. 1 = the paper's one sample per try.
    regeneration_samples: int = Field(8, ge=1, le=16)
    # Early stop when the model insists (ReflectRegenerator): when at least this share of a sampled try's
    # rewrites restate the flagged sentence, the step is kept (residual, reason `insisted`) without the
    # other tries. None: off (how often that is right: `faithproxy bench insist`, docs/judge.md).
    regeneration_insist_share: float | None = Field(None, gt=0.0, le=1.0)
    # Safety valve: regenerations one request may trigger before unfaithful steps pass uncorrected.
    max_regenerations_per_request: int = 16
    # Most steps sent to the detector in one call when it lags behind decoding.
    max_batch_steps: int = 16
    # The strictly sequential loop (Rules.sequential): one step per check, the model stopped after each
    # and continued in a new round. Slower by design: the pipelining benchmark's baseline, not a mode.
    sequential_checks: bool = False
    # Where the served model writes its thinking and how its chat template renders a partial assistant
    # message (faithcore/reasoning_formats.py: think | plain | think_answer | qwen3 | think_prompt). It
    # decides the markers that bound steps and the message a continuation sends; with --reasoning-parser
    # vLLM splits the fields itself, without one this is what tells the proxy. X-Faithproxy-Reasoning-Format
    # overrides it per request.
    reasoning_format: str = "think"
    think_open_tag: str = "<think>"
    think_close_tag: str = "</think>"

    # Seconds between malloc_trim(0) calls that hand the heap glibc holds free back to the OS
    # (server/runtime/heap_trim.py; the soak's RSS climb was freed memory kept, not live objects); 0: never.
    heap_trim_interval_s: float = Field(60.0, ge=0)
    # Blocks this size or larger are always mmapped, so they go back to the OS when freed (glibc's
    # mallopt(M_MMAP_THRESHOLD), set at start; server/runtime/heap_trim.py says why); 0: glibc's dynamic threshold.
    heap_mmap_threshold_bytes: int = Field(128 * 1024, ge=0, le=32 * 1024 * 1024)

    # Shadow checks (server/shadow/checker.py): this share of `off` requests (0 to 1; a key's policy may set
    # its own, server/admission/key_policy.py) is verified after its response has ended, off the request's
    # path, by `shadow_detector` (one that needs nothing from the live stream: judge, prompt). At most
    # `shadow_queue` wait, `shadow_concurrency` run at once, each keeps at most `shadow_max_bytes` of the
    # response; `shadow_tokens_per_minute` bounds their spend (judge tokens as the judge budget counts
    # them, plus generator tokens a self-check spends; None: no bound). What does not fit is counted in
    # faithproxy_shadow_requests_total, never waited for.
    shadow_share: float = Field(0.0, ge=0.0, le=1.0)
    shadow_detector: str = "judge"
    shadow_queue: int = Field(64, ge=1)  # × shadow_max_bytes: the most memory waiting checks hold
    shadow_concurrency: int = Field(4, ge=1)
    shadow_max_bytes: int = Field(1 * _MiB, gt=0)
    shadow_tokens_per_minute: int | None = Field(None, ge=0)
    # Upstream calls the proxy makes for verification (judge calls, regenerations, self-checks) open at
    # once, apart from max_concurrent_requests: a burst of flagged steps waits here (counted) rather than
    # opening thousands of calls (clients/call_gate.py). None: no cap.
    max_concurrent_upstream_calls: int | None = Field(256, gt=0)

    trace_path: str | None = None
    # Per-step reports of finished verified requests, for GET /v1/faithfulness/{request_id} (server/
    # reports.py): kept in memory, the newest `reports_max_count` (0: none), none older than the age.
    reports_max_count: int = Field(10_000, ge=0)
    reports_max_age_s: float = Field(3600.0, gt=0)
    # A SQLite file for them instead, which all workers of one server must share; None: in memory.
    reports_path: str | None = None
    # Redis for them instead (redis://host:6379/0), which replicas on several machines share; wins over
    # reports_path. Every call to it is bounded by reports_timeout_s: a Redis that is down or slow never
    # holds up a request (server/observe/reports_redis.py). Secret: the URL may carry Redis's password.
    reports_url: SecretStr | None = None
    reports_timeout_s: float = Field(2.0, gt=0)
    # Keep the request's images (as the data URLs the judge was given) in its report, for the report page
    # (GET /reports/{id}). Off by default: an image is often the largest and most private part of a
    # request, and every report would hold it for reports_max_age_s. Without it only their sha256 are kept.
    reports_keep_images: bool = False

    # Hidden states (route 1, clients/hidden_states.py): the layer ids vLLM was started with
    # (`--speculative-config` of extract_hidden_states); None: the server captures none, and the probe
    # and cascade detectors are not offered. vLLM writes the files; the proxy must be able to read them.
    hidden_states_layers: list[int] | None = None
    hidden_states_keep_files: bool = False
    # Also read the features of perception steps checked by other detectors (the judge), for traces
    # that `faithproxy probe train` learns from. Costs one short prefill request per perception step.
    record_features: bool = False
    probe_path: str | None = None  # a probe file (faithproxy probe train --out)
    # Cascade: the probe decides below `low` (faithful) and above `high` (unfaithful), the judge between.
    cascade_low: float = Field(0.1, ge=0.0, le=1.0)
    cascade_high: float = Field(0.9, ge=0.0, le=1.0)
    # Who checks a rewrite's candidate under the cascade: its judge alone, or the cascade as for draft
    # steps (the probe was trained on drafts; chosen on validation chains: detectors/cascade.py).
    # The choices are detectors/cascade.py's REWRITE_CHECKERS, spelled out: server/ reaches plug-ins only
    # through the registry (tests/test_layers.py); tests/detectors/test_cascade.py keeps the two equal.
    cascade_rewrites: Literal["cascade", "judge"] = "judge"
    # The consistency detector (detectors/consistency.py): samples asked of the generator per perception
    # step (one request, vLLM's `n`), their temperature and length (32 tokens: on seed 997 a sample's
    # first sentence told as much as its next few), the flag threshold on the share of samples that do
    # not support the step (or on the calibrated probability, with a calibration file), and the reader
    # that compares sentences by meaning (detectors/claim_readers.py: a name, or package.module:Class).
    consistency_samples: int = Field(8, ge=2, le=16)
    consistency_temperature: float = Field(1.0, gt=0.0, le=2.0)
    consistency_max_tokens: int = Field(32, ge=8, le=512)
    consistency_threshold: float = Field(0.25, ge=0.0, le=1.0)  # chosen on seed 997: docs/consistency.md
    consistency_claims: str = "words"
    consistency_calibration: str | None = None  # consistency_calibrate.py --out
    # One seed per step position (less noise; see detectors/consistency.py for the vLLM-CPU caveat).
    consistency_seeded: bool = True
    # The routed detector (detectors/routed.py): which detector checks each kind of claim, as
    # `kind=detector` pairs with a `*` route; kinds come from the consistency_claims reader. Counts to the
    # judge, the rest to the probe: chosen on seed 997 (docs/detector-analysis.md). A route naming a
    # detector this server does not build leaves `routed` unbuilt; text that is not routes stops the start.
    routed_routes: str = "count=judge,*=probe"

    @field_validator("reasoning_format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        if value not in FORMATS:
            raise ValueError(f"unknown reasoning format {value!r}; known: {', '.join(FORMATS)}")
        return value

    @field_validator("api_keys", mode="before")
    @classmethod
    def _keys_from_csv(cls, value: object) -> object:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value

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
