"""`faithproxy bench run`: a benchmark's questions through faithproxy (or straight to vLLM), scored.

    faithproxy bench run --dataset mmvp --data-dir ~/data/MMVP --target http://127.0.0.1:8080 \\
        --mode correct --concurrency 8 --out var/bench/mmvp-correct

Each item goes through the OpenAI SDK as one non-streamed chat completion: the image as a base64 data
URL, then the prompt text. `--mode` sets `X-Faithproxy-Mode`: `correct` (the proxy checks and fixes
perception steps), `detect` (checks only), `vanilla` (`off`: the proxy passes the request through;
vLLM itself ignores the header, so `--target` may be vLLM for the baseline).

Before the first request the release is read as published (datasets/release.py): a missing image, a
record that cannot be read or a field value the scorer does not know stops the run with one message
(exit status 2) naming the file, the record and how many are affected; `--skip-missing` leaves those
records out instead and `scores.json` says how many (`skipped`).

The run is resumable: every reply is appended to `OUT/predictions.jsonl` as it arrives, and a second run
with the same `--out` skips the ids already answered (failed ones are asked again; the last record of an
id wins). A failed request is a record with `error` filled, never an exception. When faithproxy answers,
its `faithfulness` summary (every step with its verdicts, detected and residual UPR) is kept in the
record, so UPR can be recomputed from the predictions alone.

After the requests, datasets that need a judge (FREAK free-form, MIRAGE chains) call it when
`--judge-url` is given (`OUT/judgements.jsonl`, resumable the same way); then the dataset's scorer runs
and `OUT/scores.json` holds its metrics, the run's UPR totals, tokens and latency.

`OUT/chains.jsonl` holds the answered items as labelled chains (`benchmarks/evaluation/labelled.py`), so that
`bench report --pair NAME VANILLA/chains.jsonl CORRECTED/chains.jsonl` and `bench judge-upr` take a run
as it is: steps are the reply cut by the proxy's own segmenter (reasoning, then content); when the
proxy's summary has as many steps, each carries its kind and the verdict of the delivered text
(`faithful`), plus `detected`, `regenerated`, `original_text`, `residual` and `attempts`. Each chain
records `correct` as the dataset's scorer judges that one answer.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import inspect
import json
import mimetypes
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai
from tqdm import tqdm

from faithproxy.benchmarks.evaluation import datasets
from faithproxy.benchmarks.evaluation.datasets import Item
from faithproxy.benchmarks.evaluation.datasets.release import DatasetError
from faithproxy.benchmarks.evaluation.labelled import LabelledChain, LabelledStep, write_chains
from faithproxy.clients.judge_base import JudgeBackend, JudgeConfig
from faithproxy.clients.judges import build_judge
from faithproxy.faithcore.segmenter import segment_text
from faithproxy.server.admission.policy import HEADER_MODE

MODE_HEADER_VALUES = {"vanilla": "off", "detect": "detect", "correct": "correct"}
PREDICTIONS = "predictions.jsonl"
JUDGEMENTS = "judgements.jsonl"
SCORES = "scores.json"
CHAINS = "chains.jsonl"
RUN = "run.json"
_STEP_FIELDS = ("detected", "regenerated", "original_text", "residual", "attempts")
_FAITHFUL = {"faithful": True, "unfaithful": False}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, help=f"one of: {', '.join(datasets.DATASETS)}")
    parser.add_argument("--data-dir", required=True, type=Path, help="the release as unpacked (docs/datasets.md)")
    parser.add_argument("--target", required=True, help="base URL of faithproxy or vLLM (with or without /v1)")
    parser.add_argument("--mode", choices=tuple(MODE_HEADER_VALUES), default="correct")
    parser.add_argument("--model", help="model name to request (default: the target's first model)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight at once")
    parser.add_argument("--limit", type=int, help="only the first N items")
    parser.add_argument("--out", type=Path, help="output directory (default var/bench/<dataset>-<mode>)")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per request")
    parser.add_argument("--max-retries", type=int, default=2, help="the SDK's retries of a failed request (5xx, 429)")
    parser.add_argument("--api-key", default=None, help="key for the target (default $OPENAI_API_KEY or EMPTY)")
    parser.add_argument(
        "--header", action="append", default=[], metavar="NAME=VALUE", help="extra request header (repeatable)"
    )
    parser.add_argument(
        "--loader-arg", action="append", default=[], metavar="KEY=VALUE", help="dataset option (repeatable)"
    )
    parser.add_argument(
        "--skip-missing",
        action="store_true",
        help="leave out records whose image is missing or that cannot be read, and report how many "
        "(default: stop before asking the model)",
    )
    parser.add_argument("--judge-url", help="OpenAI-compatible judge for datasets that need one (FREAK, MIRAGE)")
    parser.add_argument(
        "--judge-model", action="append", default=[], help="judge model (repeatable: MIRAGE's M judges)"
    )
    parser.add_argument("--judge-api-key", default=None, help="key for the judge (default $OPENAI_API_KEY or EMPTY)")
    parser.add_argument("--judge-concurrency", type=int, default=4)


def main(args: argparse.Namespace) -> int:
    return asyncio.run(run(args))


def _pairs(values: Sequence[str], what: str) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"{what} must look like KEY=VALUE, not {value!r}")
        out[key.strip()] = rest
    return out


def _openai_base(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def image_data_url(path: Path) -> str:
    media_type = mimetypes.guess_type(path.name)[0] or "image/png"
    return f"data:{media_type};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def messages_for(item: Item) -> list[dict[str, Any]]:
    """One user turn: the image (if any) as a data URL, then the prompt."""
    if item.image is None:
        return [{"role": "user", "content": item.prompt}]
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image_data_url(item.image)}},
                {"type": "text", "text": item.prompt},
            ],
        }
    ]


def read_jsonl(path: Path) -> dict[str, dict[str, Any]]:
    """id → the last record of that id; a torn last line (a killed run) is skipped."""
    records: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return records
    for line in path.read_text(encoding="utf-8").split("\n"):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "id" in record:
            records[str(record["id"])] = record
    return records


class _Appender:
    """Appends one JSON line per record and flushes it, so a killed run loses at most the line in flight."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


async def ask(
    client: openai.AsyncOpenAI, item: Item, *, model: str, headers: dict[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    """The prediction record for one item; failures fill `error` instead of raising."""
    record: dict[str, Any] = {"id": item.id, "text": None, "reasoning": None, "error": None}
    started = time.perf_counter()
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages_for(item),  # type: ignore[arg-type]
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            extra_headers=headers,
        )
        completion = raw.parse()
        choice = completion.choices[0]
        message_extra = choice.message.model_extra or {}
        extra = completion.model_extra or {}
        record.update(
            text=choice.message.content or "",
            reasoning=message_extra.get("reasoning") or message_extra.get("reasoning_content"),
            finish_reason=choice.finish_reason,
            usage=completion.usage.model_dump() if completion.usage else None,
            faithfulness=extra.get("faithfulness"),
            request_id=raw.headers.get("x-faithproxy-request-id"),
        )
    except (openai.OpenAIError, OSError, ValueError, IndexError) as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"[:500]
    record["latency_s"] = round(time.perf_counter() - started, 3)
    return record


def faithfulness_totals(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """UPR over the whole run from the per-request summaries faithproxy returned (None without any)."""
    summaries = [r["faithfulness"] for r in records if isinstance(r.get("faithfulness"), dict)]
    if not summaries:
        return {"requests_with_summary": 0, "upr_detected": None, "upr_residual": None}
    perception = sum(s.get("perception_steps", 0) for s in summaries)
    detected = sum(s.get("unfaithful_detected", 0) for s in summaries)
    residual = sum(s.get("residual", 0) for s in summaries)
    return {
        "requests_with_summary": len(summaries),
        "steps": sum(len(s.get("steps", ())) for s in summaries),
        "perception_steps": perception,
        "unfaithful_detected": detected,
        "residual": residual,
        "upr_detected": detected / perception if perception else None,
        "upr_residual": residual / perception if perception else None,
        "regenerations": sum(s.get("regenerations", 0) for s in summaries),
        "fixed": sum(s.get("fixed", 0) for s in summaries),
    }


def cost_totals(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Tokens and latency of the answered requests (what correction costs, next to a vanilla run)."""
    answered = [r for r in records if not r.get("error")]
    latencies = sorted(r["latency_s"] for r in answered if isinstance(r.get("latency_s"), int | float))

    def tokens(key: str) -> int:
        return sum(int((r.get("usage") or {}).get(key) or 0) for r in answered)

    def quantile(q: float) -> float | None:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else None

    return {
        "prompt_tokens": tokens("prompt_tokens"),
        "completion_tokens": tokens("completion_tokens"),
        "latency_s_mean": statistics.fmean(latencies) if latencies else None,
        "latency_s_p50": quantile(0.5),
        "latency_s_p95": quantile(0.95),
    }


def chain_of(item: Item, record: dict[str, Any], module: Any, *, dataset: str, mode: str) -> LabelledChain:
    """One answered item as a labelled chain (see the module docstring)."""
    channels = (record.get("reasoning") or "", record.get("text") or "")
    texts = [s.text for channel in channels for s in segment_text(channel) if s.text]
    summary = (record.get("faithfulness") or {}).get("steps") or []
    aligned = len(summary) == len(texts)
    steps = []
    for k, text in enumerate(texts):
        note = summary[k] if aligned else {}
        steps.append(
            LabelledStep(
                text=text,
                kind=note.get("kind"),
                faithful=_FAITHFUL.get(note.get("verdict")) if note.get("kind") == "perception" else None,
                extra={key: note[key] for key in _STEP_FIELDS if key in note},
            )
        )
    return LabelledChain(
        id=item.id,
        question=item.prompt,
        image=str(item.image) if item.image is not None else None,
        steps=steps,
        answer=record.get("text"),
        gold_answer=item.answer,
        extra={
            "correct": module.correct(item, record),
            "dataset": dataset,
            "mode": mode,
            "request_id": record.get("request_id"),
            "steps_aligned": aligned if summary else None,
        },
    )


async def _default_model(client: openai.AsyncOpenAI) -> str:
    models = await client.models.list()
    if not models.data:
        raise SystemExit("the target lists no models; pass --model")
    return models.data[0].id


def _check_run_file(out: Path, settings: dict[str, Any]) -> None:
    """Refuse to resume into a directory written for another dataset, mode or model."""
    path = out / RUN
    if path.exists():
        before = json.loads(path.read_text())
        for key in ("dataset", "mode", "model"):
            if before.get(key) != settings[key]:
                raise SystemExit(
                    f"{out} holds a run with {key}={before.get(key)!r}, not {settings[key]!r}: use another --out"
                )
    path.write_text(json.dumps(settings, indent=2) + "\n")


async def _query_all(
    client: openai.AsyncOpenAI, todo: list[Item], out: Path, *, model: str, headers: dict[str, str], args
) -> None:
    limit = asyncio.Semaphore(max(1, args.concurrency))
    appender = _Appender(out / PREDICTIONS)
    progress = tqdm(total=len(todo), desc=f"{args.dataset} ({args.mode})", unit="q", file=sys.stderr)

    async def one(item: Item) -> None:
        async with limit:
            record = await ask(client, item, model=model, headers=headers, args=args)
        appender.write(record)
        progress.update(1)
        if record["error"]:
            progress.set_postfix_str("errors seen", refresh=False)

    try:
        await asyncio.gather(*(one(i) for i in todo))
    finally:
        progress.close()
        appender.close()


def _judges(args: argparse.Namespace) -> list[JudgeBackend]:
    key = args.judge_api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    return [
        build_judge(
            JudgeConfig(
                name=f"judge{k}",
                backend="openai",
                model=model,
                base_url=_openai_base(args.judge_url),
                api_key=key,
                temperature=0.0,
                timeout_s=args.timeout,
            )
        )
        for k, model in enumerate(args.judge_model or ["judge"])
    ]


async def _judge_all(module, items: list[Item], predictions: dict[str, dict[str, Any]], out: Path, args) -> None:
    path = out / JUDGEMENTS
    done = read_jsonl(path)
    todo = [i for i in items if i.id not in done and i.id in predictions and not predictions[i.id].get("error")]
    if todo:
        backends = _judges(args)
        try:
            fresh = await module.judge(todo, predictions, backends, concurrency=args.judge_concurrency)
        finally:
            for backend in backends:
                await backend.aclose()
        appender = _Appender(path)
        try:
            for item_id, fields in fresh.items():
                appender.write({"id": item_id, **fields})
        finally:
            appender.close()
        done.update({k: {"id": k, **v} for k, v in fresh.items()})
    for item_id, fields in done.items():
        if item_id in predictions:
            predictions[item_id] = {**predictions[item_id], **{k: v for k, v in fields.items() if k != "id"}}


def loader_options(module, dataset: str, loader_args: Sequence[str]) -> dict[str, str]:
    """The `--loader-arg KEY=VALUE` pairs, checked against the options the dataset's loader takes."""
    options = _pairs(loader_args, "--loader-arg")
    known = [name for name in inspect.signature(module.load).parameters if name != "data_dir"]
    if unknown := sorted(set(options) - set(known)):
        raise ValueError(f"{dataset} has no option {', '.join(unknown)}; its options: {', '.join(known)}")
    return options


def _prepare(module, args: argparse.Namespace) -> tuple[list[Item], Path, dict[str, Any]]:
    """The items to ask, the output folder, and what the release check left out. A release with
    problems stops here, before any request, unless `--skip-missing` (release.py)."""
    options = loader_options(module, args.dataset, args.loader_arg)
    release = module.read(args.data_dir, **options)
    if release.problems and not getattr(args, "skip_missing", False):
        raise release.error()
    skipped = {"records": len(release.problems), "by_kind": release.problem_counts}
    items = release.items
    if twice := sorted(k for k, n in Counter(i.id for i in items).items() if n > 1):
        raise ValueError(f"{args.dataset}: item ids occur twice ({', '.join(twice[:5])}): results would mix")
    if args.limit is not None:
        items = items[: args.limit]
    out: Path = args.out or Path("var/bench") / f"{args.dataset.lower()}-{args.mode}"
    out.mkdir(parents=True, exist_ok=True)
    return items, out, skipped


async def run(args: argparse.Namespace) -> int:
    """The whole run; returns the exit status (1 when no item got an answer)."""
    try:
        module = datasets.get(args.dataset)
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    try:
        items, out, skipped = _prepare(module, args)
    except DatasetError as exc:
        print(exc, file=sys.stderr)
        return 2
    headers = {HEADER_MODE: MODE_HEADER_VALUES[args.mode], **_pairs(args.header, "--header")}

    api_key = args.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    client = openai.AsyncOpenAI(
        base_url=_openai_base(args.target), api_key=api_key, timeout=args.timeout, max_retries=args.max_retries
    )
    try:
        model = args.model or await _default_model(client)
        settings = {
            "dataset": args.dataset.lower(),
            "mode": args.mode,
            "model": model,
            "target": args.target,
            "data_dir": str(args.data_dir),
            "loader_args": args.loader_arg,
            "headers": headers,
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
        }
        _check_run_file(out, settings)
        done = read_jsonl(out / PREDICTIONS)
        todo = [i for i in items if i.id not in done or done[i.id].get("error")]
        await _query_all(client, todo, out, model=model, headers=headers, args=args)
    finally:
        await client.close()

    ids = {i.id for i in items}
    predictions = {k: v for k, v in read_jsonl(out / PREDICTIONS).items() if k in ids}
    if hasattr(module, "judge"):
        if args.judge_url:
            await _judge_all(module, items, predictions, out, args)
        else:
            print(f"note: {args.dataset} scores some metrics with a judge; without --judge-url they stay unset",
                  file=sys.stderr)  # fmt: skip
    errors = sum(1 for p in predictions.values() if p.get("error"))
    scores = {
        "dataset": args.dataset.lower(),
        "mode": args.mode,
        "model": model,
        "items": len(items),
        **({"skipped": skipped} if skipped["records"] else {}),
        "answered": len(predictions) - errors,
        "errors": errors,
        "metrics": module.score(items, predictions),
        "faithfulness": faithfulness_totals(list(predictions.values())),
        "cost": cost_totals(list(predictions.values())),
    }
    _write_outputs(out, scores, module, items, predictions, args)
    print(json.dumps(scores, indent=2))
    return 0 if scores["answered"] or not items else 1


def _write_outputs(out: Path, scores: dict[str, Any], module: Any, items: list[Item], predictions, args) -> None:
    chains = [
        chain_of(item, predictions[item.id], module, dataset=scores["dataset"], mode=args.mode)
        for item in items
        if item.id in predictions and not predictions[item.id].get("error")
    ]
    write_chains(out / CHAINS, chains)
    (out / SCORES).write_text(json.dumps(scores, indent=2) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="faithproxy bench run", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return parser


if __name__ == "__main__":
    raise SystemExit(main(build_parser().parse_args()))
