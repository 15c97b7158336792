"""`faithproxy demo`: the whole system on one CPU machine, as a user would run it.

Builds the fixture model if it is missing (a few minutes, seeded), then starts three real processes —
vLLM on CPU serving it, a local judge speaking the Anthropic Messages API, and `faithproxy serve` —
sends questions with an image through the openai SDK, prints each step as it is verified (and
corrected), the UPR, and stops everything it started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

DEMO_FIXTURES = ("red_circle", "green_circle", "blue_square")


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}; see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not become healthy in {timeout:.0f}s; see {log}")


def _start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _print_stream(client: Any, model: str, fixture: str) -> dict[str, Any]:
    from tinyvlm import fixture_spec as spec

    f = spec.get(fixture)
    print(f"\n=== {fixture}: {f.question}")
    stream = client.chat.completions.create(
        model=model,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": spec.data_url(fixture)}},
                    {"type": "text", "text": f.question},
                ],
            }
        ],
        temperature=0.0,
        max_tokens=200,
        stream=True,
        extra_headers={"X-Faithproxy-Mode": "correct", "X-Faithproxy-Detector": "judge"},
    )
    summary: dict[str, Any] = {}
    for chunk in stream:
        extra = (chunk.model_extra or {}).get("faithfulness") or {}
        step = extra.get("step")
        if step:
            raw = chunk.choices[0].delta.content or ""
            text = raw.replace("<think>", "").replace("</think>", "").strip()
            if step["regenerated"]:
                mark = f"FIXED after {step['attempts']} try(s) (was: {step['original_text']!r})"
            elif step["residual"]:
                mark = f"STILL UNFAITHFUL after {step['attempts']} tries" if step["attempts"] else "unchecked"
            else:
                mark = step["verdict"] if step["kind"] == "perception" else ""
            print(f"  [{step['index']}] {step['kind']:<10} {text:<52} {mark}", flush=True)
        elif chunk.choices and chunk.choices[0].delta.content:
            print(f"       {chunk.choices[0].delta.content.strip()!r}")
        if "perception_steps" in extra:
            summary = extra
    print(
        f"  perception steps {summary.get('perception_steps')}, detected UPR {summary.get('upr_detected', 0):.2f}, "
        f"residual UPR {summary.get('upr_residual', 0):.2f}, regenerations {summary.get('regenerations')}"
    )
    return summary


def run_demo(workdir: str = "var/demo", keep: bool = False) -> int:
    from openai import OpenAI

    from tinyvlm import fixture_spec as spec
    from tinyvlm.serve import free_port, start_vllm

    work = Path(workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model_dir = Path(os.environ.get("FAITHPROXY_FIXTURE_MODEL_DIR", "var/models/fixture-vlm")).resolve()
    print(f"[demo] fixture model: {model_dir} (built if missing or stale)", flush=True)
    subprocess.run([sys.executable, "-m", "tinyvlm.train_fixture", "--out", str(model_dir), "--if-stale"], check=True)
    oracle = work / "oracle.json"
    oracle.write_text(json.dumps(spec.oracle_json()))
    started: list[Any] = []
    try:
        print("[demo] starting vLLM on CPU ...", flush=True)
        vllm = start_vllm(model_dir, log_path=work / "vllm.log")
        started.append(vllm)
        judge_port, proxy_port = free_port(), free_port()
        judge = _start(
            [sys.executable, "-m", "benchmarks.judge_server", "--port", str(judge_port), "--oracle", str(oracle)],
            work / "judge.log",
        )
        started.append(judge)
        judges = [
            {
                "name": "local",
                "backend": "anthropic",
                "model": "local-judge",
                "base_url": f"http://127.0.0.1:{judge_port}",
                "api_key": "local",
            }
        ]
        proxy = _start(
            [
                sys.executable,
                "-m",
                "server.cli",
                "serve",
                "--upstream",
                vllm.base_url,
                "--port",
                str(proxy_port),
                "--traces",
                str(work / "traces.jsonl"),
                "--log-level",
                "warning",
            ],
            work / "proxy.log",
            env={"FAITHPROXY_JUDGES": json.dumps(judges), "FAITHPROXY_REGENERATION_TEMPERATURE": "0"},
        )
        started.append(proxy)
        _wait_healthy(f"http://127.0.0.1:{judge_port}/_stats", judge, 60, work / "judge.log")
        _wait_healthy(f"http://127.0.0.1:{proxy_port}/readyz", proxy, 60, work / "proxy.log")
        print(f"[demo] vLLM {vllm.base_url}  judge :{judge_port}  faithproxy http://127.0.0.1:{proxy_port}/v1")
        client = OpenAI(base_url=f"http://127.0.0.1:{proxy_port}/v1", api_key="demo")
        totals = {"perception_steps": 0, "unfaithful_detected": 0, "residual": 0}
        for fixture in DEMO_FIXTURES:
            summary = _print_stream(client, vllm.model, fixture)
            for key in totals:
                totals[key] += int(summary.get(key, 0))
        n = totals["perception_steps"] or 1
        print(
            f"\n[demo] over {len(DEMO_FIXTURES)} chains: {totals['perception_steps']} perception steps, "
            f"detected UPR {totals['unfaithful_detected'] / n:.3f}, residual UPR {totals['residual'] / n:.3f}"
        )
        print(f"[demo] traces: {work / 'traces.jsonl'}; metrics: http://127.0.0.1:{proxy_port}/metrics")
        if keep:
            print("[demo] servers left running; Ctrl-C stops them")
            while True:
                time.sleep(3600)
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        for process in reversed(started):
            if hasattr(process, "stop"):
                process.stop()
            else:
                _stop(process)
