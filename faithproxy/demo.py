"""`faithproxy demo`: the whole system on one CPU machine, as a user would run it.

It lives at the top of the house, beside the command, because it uses every layer: the server, the
fixture and ShapesWorld models (benchmarks/tinyvlm/, benchmarks/shapesworld/) and a stand-in judge
(benchmarks/standins/).

Starts three real processes — vLLM on CPU serving a tiny reasoning VLM, a local judge speaking the
Anthropic Messages API, and `faithproxy serve` — sends questions with an image through the openai
SDK, prints each step as it is verified (and corrected), the UPR, and stops everything it started.

Two worlds:
- `shapesworld` (the default): the committed ShapesWorld model (benchmarks/shapesworld/model/weights) answers
  held-out questions about scenes it has never seen and makes its own perception mistakes; the judge
  reads the image's pixels (`faithproxy.benchmarks.standins.judge_server --shapesworld`). Each step is
  printed with the ground truth next to the proxy's verdict, so what the proxy catches and misses is
  visible.
- `fixture`: the tinyvlm fixture model with planted mistakes and an oracle judge (built first if
  missing, a few minutes, seeded).

`--format qwen3|glm|plain` shows a reasoning model's own output format instead (benchmarks/tinyvlm/formats_spec.py):
the tiny format model served with Qwen3-VL-Thinking's, GLM-4.1V-Thinking's or Qwen2.5-VL's chat template
and vLLM's reasoning parser for it, the proxy told the format (FAITHPROXY_REASONING_FORMAT), and planted
mistakes in the thinking and in the answer. Each step is printed with the field it arrived in.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.tinyvlm.processes import supervised

DEMO_FIXTURES = ("red_circle", "green_circle", "blue_square")
SHAPESWORLD_QUESTIONS = 5  # held-out items 0..4: one question of each type


def _print_stream(
    client: Any, model: str, title: str, question: str, image_url: str, truth: Any = None
) -> dict[str, Any]:
    """Streams one question through the proxy and prints each verified step; `truth(sentence)` (if
    given) returns True/False/None for what the sentence says about the image in fact."""
    print(f"\n=== {title}: {question}")
    stream = client.chat.completions.create(
        model=model,
        messages=[
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": question}],
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
            where, raw = _delta_text(chunk)
            text = raw
            for tag in ("<think>", "</think>", "<answer>", "</answer>"):
                text = text.replace(tag, "")
            text = text.strip()
            if where != "content":
                text = f"({where}) {text}"
            if step["regenerated"]:
                mark = f"FIXED after {step['attempts']} try(s) (was: {step['original_text'].strip()!r})"
            elif step["residual"]:
                mark = f"STILL UNFAITHFUL after {step['attempts']} tries" if step["attempts"] else "unchecked"
            else:
                mark = step["verdict"] if step["kind"] == "perception" else ""
            fact = truth(text) if truth is not None else None
            facts = "" if fact is None else ("  [truth: true]" if fact else "  [truth: FALSE]")
            print(f"  [{step['index']}] {step['kind']:<10} {text:<52} {mark}{facts}", flush=True)
        elif chunk.choices and _delta_text(chunk)[1].strip():
            print(f"       {_delta_text(chunk)[1].strip()!r}")
        if "perception_steps" in extra:
            summary = extra
    print(
        f"  perception steps {summary.get('perception_steps')}, detected UPR {summary.get('upr_detected', 0):.2f}, "
        f"residual UPR {summary.get('upr_residual', 0):.2f}, regenerations {summary.get('regenerations')}"
    )
    return summary


def _delta_text(chunk: Any) -> tuple[str, str]:
    """(field, text) of a streamed chunk's delta: `content`, or the `reasoning` a reasoning parser split off."""
    if not chunk.choices:
        return "content", ""
    delta = chunk.choices[0].delta
    for name in ("reasoning", "reasoning_content"):
        text = (delta.model_extra or {}).get(name)
        if isinstance(text, str) and text:
            return name, text
    return "content", delta.content or ""


def _format_questions() -> list[tuple[str, str, str, Any]]:
    from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
    from faithproxy.benchmarks.tinyvlm import formats_spec as fs

    return [(name, spec.get(name).question, spec.data_url(name), None) for name in fs.CHAINS]


def _fixture_questions() -> list[tuple[str, str, str, Any]]:
    from faithproxy.benchmarks.tinyvlm import fixture_spec as spec

    return [(name, spec.get(name).question, spec.data_url(name), None) for name in DEMO_FIXTURES]


def _shapesworld_questions(count: int) -> list[tuple[str, str, str, Any]]:
    from faithproxy.benchmarks.shapesworld.claims import check_sentence
    from faithproxy.benchmarks.shapesworld.model.evaluate import data_url
    from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items

    def truth_of(objects: Any) -> Any:
        return lambda sentence: check_sentence(sentence, objects).faithful

    return [
        (f"held-out {item.id} ({item.question.qtype})", item.question.prompt, data_url(item.scene),
         truth_of(item.scene.objects))
        for item in heldout_items(count)
    ]  # fmt: skip


@supervised()  # SIGTERM, SIGINT (even when started with it ignored) or a failure: nothing left running
def run_demo(
    workdir: str = "var/demo",
    keep: bool = False,
    world: str = "shapesworld",
    questions: int = SHAPESWORLD_QUESTIONS,
    reasoning_format: str | None = None,
    start_timeout: float = 600.0,
) -> int:
    from openai import OpenAI

    from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
    from faithproxy.benchmarks.tinyvlm.processes import Child, ChildStartError, free_port, spawn, stop_all
    from faithproxy.benchmarks.tinyvlm.serve import start_vllm

    work = Path(workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    vllm_args: list[str] = []
    served_name = "fixture-vlm"
    if reasoning_format is not None:
        from faithproxy.benchmarks.tinyvlm import formats_spec as fs

        family = fs.FAMILIES[reasoning_format]
        formats_dir = Path(os.environ.get("FAITHPROXY_FORMATS_MODEL_DIR", "var/models/formats")).resolve()
        print(f"[demo] format model {family.name}: {formats_dir} (built if missing or stale)", flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "faithproxy.benchmarks.tinyvlm.train_formats",
                "--out",
                str(formats_dir),
                "--if-stale",
            ],
            check=True,
        )
        model_dir, served_name, vllm_args = formats_dir / family.name, family.name, family.vllm_args()
        print(f"[demo] vLLM flags: {' '.join(vllm_args)}; FAITHPROXY_REASONING_FORMAT={family.reasoning_format}")
        oracle = work / "oracle.json"
        oracle.write_text(json.dumps(fs.oracle_json()))
        judge_args = ["--oracle", str(oracle)]
        asked = _format_questions()
        proxy_env = {"FAITHPROXY_REGENERATION_TEMPERATURE": "0", "FAITHPROXY_REASONING_FORMAT": family.reasoning_format}
    elif world == "shapesworld":
        from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR

        model_dir = WEIGHTS_DIR.resolve()
        print(f"[demo] ShapesWorld model: {model_dir} (committed weights)", flush=True)
        judge_args = ["--shapesworld"]
        asked = _shapesworld_questions(questions)
        # Try 1 of a regeneration is greedy; later tries sample (the model is trained for both).
        proxy_env: dict[str, str] = {}
    else:
        model_dir = Path(os.environ.get("FAITHPROXY_FIXTURE_MODEL_DIR", "var/models/fixture-vlm")).resolve()
        print(f"[demo] fixture model: {model_dir} (built if missing or stale)", flush=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "faithproxy.benchmarks.tinyvlm.train_fixture",
                "--out",
                str(model_dir),
                "--if-stale",
            ],
            check=True,
        )
        oracle = work / "oracle.json"
        oracle.write_text(json.dumps(spec.oracle_json()))
        judge_args = ["--oracle", str(oracle)]
        asked = _fixture_questions()
        proxy_env = {"FAITHPROXY_REGENERATION_TEMPERATURE": "0"}  # the fixture model's fixes are greedy
    started: list[Child] = []
    try:
        print("[demo] starting vLLM on CPU ...", flush=True)
        vllm = start_vllm(
            model_dir,
            extra_args=vllm_args,
            served_model_name=served_name,
            log_path=work / "vllm.log",
            health_timeout=start_timeout,
        )
        started.append(vllm.child)
        judge_port, proxy_port = free_port(), free_port()
        judge_argv = [sys.executable, "-m", "faithproxy.benchmarks.standins.judge_server", "--port", str(judge_port)]
        judge = spawn([*judge_argv, *judge_args], work / "judge.log", name="judge")
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
        proxy = spawn(
            [
                sys.executable,
                "-m",
                "faithproxy.cli",
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
            name="faithproxy",
            env={**os.environ, "FAITHPROXY_JUDGES": json.dumps(judges), **proxy_env},
        )
        started.append(proxy)
        # Both started before either is waited for, so they come up side by side.
        judge.wait_healthy(f"http://127.0.0.1:{judge_port}/_stats", 60)
        proxy.wait_healthy(f"http://127.0.0.1:{proxy_port}/readyz", 60)
        print(f"[demo] vLLM {vllm.base_url}  judge :{judge_port}  faithproxy http://127.0.0.1:{proxy_port}/v1")
        client = OpenAI(base_url=f"http://127.0.0.1:{proxy_port}/v1", api_key="demo")
        totals = {"perception_steps": 0, "unfaithful_detected": 0, "residual": 0}
        for title, question, image_url, truth in asked:
            summary = _print_stream(client, vllm.model, title, question, image_url, truth)
            for key in totals:
                totals[key] += int(summary.get(key, 0))
        n = totals["perception_steps"] or 1
        print(
            f"\n[demo] over {len(asked)} chains: {totals['perception_steps']} perception steps, "
            f"detected UPR {totals['unfaithful_detected'] / n:.3f}, residual UPR {totals['residual'] / n:.3f}"
        )
        print(f"[demo] traces: {work / 'traces.jsonl'}; metrics: http://127.0.0.1:{proxy_port}/metrics")
        if keep:
            print("[demo] servers left running; Ctrl-C stops them")
            while True:
                time.sleep(3600)
        return 0
    except ChildStartError as exc:
        print(start_failure(str(exc)), file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        stop_all(started)


_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception)\b:?")


def start_failure(message: str, causes: int = 3) -> str:
    """What the demo prints when a server it starts does not come up: which one, the exception lines
    of its log (vLLM states the root cause above its final "Engine core initialization failed"), and
    where the whole log is. `message` is a ChildStartError's: "NAME WHAT; log PATH:\nTAIL"."""
    headline, _, tail = message.partition("\n")
    found: list[str] = []
    for line in tail.splitlines():
        text = re.sub(r"^.*?\] ", "", line.strip())  # vLLM's "(EngineCore pid=1) ERROR ... file.py:12] " prefix
        if _EXCEPTION_LINE.match(text) and text not in found:
            found.append(text)
    if not found:  # no exception: it was still starting, or died without one; its last words
        found = [line.strip() for line in tail.splitlines() if line.strip()][-causes:] or ["(its log is empty)"]
    cause = "\n".join(f"  {line}" for line in found[-causes:])
    return f"[demo] failed to start: {headline.rstrip(':')}\n[demo] cause:\n{cause}"


def add_demo_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds `demo` to the `faithproxy` command's subparsers."""
    demo = sub.add_parser("demo", help="real vLLM on CPU + local judge + proxy, a few questions, printed live")
    demo.add_argument("--workdir", default="var/demo", help="where models, logs and traces go")
    demo.add_argument("--keep", action="store_true", help="leave the servers running (Ctrl-C stops them)")
    demo.add_argument(
        "--world",
        choices=["shapesworld", "fixture"],
        default="shapesworld",
        help="shapesworld: the committed model's own mistakes, pixel judge; fixture: planted mistakes, oracle",
    )
    demo.add_argument("--questions", type=int, default=5, help="shapesworld: how many held-out questions")
    demo.add_argument(
        "--start-timeout",
        type=float,
        default=600.0,
        help="seconds vLLM may take to answer /health (a busy 2-core machine needs minutes)",
    )
    demo.add_argument(
        "--format",
        choices=["qwen3", "glm", "plain"],
        default=None,
        help="a reasoning model's output format instead of a world: Qwen3-VL-Thinking, GLM-4.1V-Thinking or "
        "Qwen2.5-VL/ThinkLite-VL (the tiny format model with that family's template and vLLM parser)",
    )
    demo.set_defaults(
        func=lambda args: run_demo(
            workdir=args.workdir,
            keep=args.keep,
            world=args.world,
            questions=args.questions,
            reasoning_format=args.format,
            start_timeout=args.start_timeout,
        )
    )
