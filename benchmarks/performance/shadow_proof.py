"""Shadow checks measured (server/shadow/checker.py): on ShapesWorld chains from real vLLM, shadow UPR at
share 1.0 equals detect mode's on the same chains; at share s over N off requests, the checked count
stays within binomial bounds.

    python -m faithproxy.benchmarks.performance.shadow_proof [--n 20 --share 0.3 --requests 400 \\
        --doors responses,messages --json benchmarks/results/shadow-proof.json]

Part 1: vLLM serves the committed ShapesWorld model; faithproxy runs in this process with the pixel judge
(benchmarks/standins/judge_server.py --shapesworld) and FAITHPROXY_SHADOW_SHARE=1.0. Each item (scenes of
the development seeds 997 and 999 only, half each) is sent twice, greedy: in off mode (checked after the
fact) and in detect mode. A pair counts when both chains are the same text; over those pairs the shadow
report's perception steps and flags are added up beside detect's, per chain and in total, and each step's
kind and detected verdict are compared one by one (`steps_equal`). Detect mode runs with each step checked
on its own (FAITHPROXY_MAX_BATCH_STEPS=1), as the shadow replay checks them: live detect batches the steps
that ended while the judge was busy, and a judge names only the first unfaithful step of a batch.

With `--doors`, the same is done on the Responses and Messages doors (each API's own request for the same
question; off mode's capture is vLLM's /v1/responses or /v1/messages wire, detect mode runs the door's
translation to chat). The completions door is not in it: its raw prompt carries no image, which the pixel
judge needs (tests/server/test_shadow_steps.py covers it against the fake vLLM).

Part 2: a proxy in front of the fake vLLM at share `--share` serves `--requests` off requests; the number
checked (faithproxy_shadow_requests_total) is compared with the 99.9% two-sided interval of
Binomial(N, s), computed exactly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from faithproxy.benchmarks.evaluation.shapesworld_bench import MAX_TOKENS
from faithproxy.benchmarks.shapesworld.model import WEIGHTS_DIR
from faithproxy.benchmarks.shapesworld.model.corpus import HELDOUT_SEED, VALIDATION_SEED, user_message
from faithproxy.benchmarks.shapesworld.model.evaluate import SERVED_NAME, data_url
from faithproxy.benchmarks.shapesworld.model.scoring import heldout_items
from faithproxy.benchmarks.shapesworld.pixel_judge import PixelJudge
from faithproxy.benchmarks.standins.judge_server import create_app as create_judge_app
from faithproxy.benchmarks.standins.judge_server import running_judge_server
from faithproxy.benchmarks.tinyvlm.serve import start_vllm
from faithproxy.clients.judges import JudgeConfig
from faithproxy.server.app import create_app
from faithproxy.server.settings import Settings
from faithproxy.testing import FakeUpstream, metric, running_app

SEEDS = (VALIDATION_SEED, HELDOUT_SEED)  # the development seeds: never the training ones


def binomial_interval(n: int, p: float, mass: float = 0.999) -> tuple[int, int]:
    """The smallest k_lo and largest k_hi with P(K < k_lo) and P(K > k_hi) each at most (1 - mass) / 2."""
    tail = (1 - mass) / 2
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    low, acc = 0, 0.0
    while acc + pmf[low] <= tail:
        acc += pmf[low]
        low += 1
    high, acc = n, 0.0
    while acc + pmf[high] <= tail:
        acc += pmf[high]
        high -= 1
    return low, high


def _judge(url: str) -> JudgeConfig:
    return JudgeConfig(name="pixels", backend="anthropic", model="pixel-judge", base_url=url, api_key="sk-proof")  # type: ignore[arg-type]


DOOR_PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def door_body(door: str, prompt: str, image_url: str, stream: bool) -> dict[str, Any]:
    """One ShapesWorld question on `door`, greedy: the same chat turn in the door's own API."""
    common = {"model": SERVED_NAME, "temperature": 0, "stream": stream}
    if door == "responses":
        parts = [{"type": "input_image", "image_url": image_url}, {"type": "input_text", "text": prompt}]
        return {**common, "input": [{"role": "user", "content": parts}], "max_output_tokens": MAX_TOKENS}
    if door == "messages":
        media, _, data = image_url.removeprefix("data:").partition(";base64,")
        image = {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
        content = [image, {"type": "text", "text": prompt}]
        return {**common, "messages": [{"role": "user", "content": content}], "max_tokens": MAX_TOKENS}
    return {**common, "messages": [user_message(prompt, image_url)], "max_tokens": MAX_TOKENS}


async def same_chains(vllm_url: str, n: int, door: str = "chat") -> dict[str, Any]:
    items = [*heldout_items(n // 2, SEEDS[0]), *heldout_items(n - n // 2, SEEDS[1])]
    path = DOOR_PATHS[door]
    async with running_judge_server(create_judge_app(PixelJudge())) as judge_url:
        settings = Settings(
            upstream_url=vllm_url, judges=[_judge(judge_url)], shadow_share=1.0, max_retries=0, max_batch_steps=1
        )
        app = create_app(settings)
        async with running_app(app) as url, httpx.AsyncClient(base_url=url, timeout=600) as http:
            state = app.state.faithproxy
            pairs = []
            for i, item in enumerate(items):
                # streamed and whole responses alike
                body = door_body(door, item.question.prompt, data_url(item.scene), stream=i % 2 == 0)
                off = await http.post(path, json=body, headers={"x-faithproxy-mode": "off"})
                detect = await http.post(path, json={**body, "stream": False}, headers={"x-faithproxy-mode": "detect"})
                await state.shadow.drained()
                reports = []
                for response in (detect, off):  # the stored reports hold each step's text
                    found = await http.get(f"/v1/faithfulness/{response.headers['x-faithproxy-request-id']}")
                    reports.append(found.json() if found.status_code == 200 else None)
                pairs.append((item.id, off, *reports))
            text = (await http.get("/metrics")).text
            sampled = "faithproxy_shadow_requests_total"
            outcomes = {o: metric(text, sampled, outcome=o) for o in ("checked", "unreadable", "failed")}
    rows = []
    for item_id, off, detect, shadow in pairs:
        detect_f = (detect or {}).get("faithfulness") or {}
        shadow_f = (shadow or {}).get("faithfulness") or {}
        detect_text = " ".join(str(s.get("text")) for s in detect_f.get("steps", []))
        shadow_text = " ".join(str(s.get("text")) for s in shadow_f.get("steps", []))
        detect_steps = [[s.get("kind"), s.get("detected")] for s in detect_f.get("steps", [])]
        shadow_steps = [[s.get("kind"), s.get("detected")] for s in shadow_f.get("steps", [])]
        rows.append(
            {
                "item": item_id,
                "off_status": off.status_code,
                "same_chain": bool(shadow) and bool(detect) and detect_text == shadow_text,
                "detect": [detect_f.get("perception_steps"), detect_f.get("unfaithful_detected")],
                "shadow": [shadow_f.get("perception_steps"), shadow_f.get("unfaithful_detected")],
                "steps_equal": detect_steps == shadow_steps,
                "detect_steps": detect_steps,  # [kind, detected verdict] of each step
                "shadow_steps": shadow_steps,
            }
        )
    same = [r for r in rows if r["same_chain"]]

    def upr(side: str) -> dict[str, Any]:
        steps = sum(r[side][0] or 0 for r in same)
        flagged = sum(r[side][1] or 0 for r in same)
        return {"perception_steps": steps, "unfaithful": flagged, "upr": round(flagged / steps, 6) if steps else None}

    return {
        "door": path,
        "seeds": list(SEEDS),
        "items": len(rows),
        "same_chains": len(same),
        "chains_with_equal_counts": sum(1 for r in same if r["detect"] == r["shadow"]),
        "chains_with_equal_steps": sum(1 for r in same if r["steps_equal"]),
        "detect": upr("detect"),
        "shadow": upr("shadow"),
        "equal": upr("detect") == upr("shadow"),
        "shadow_outcomes": outcomes,
        "metrics": {
            source: {
                v: metric(text, "faithproxy_perception_steps_total", source=source, verdict=v)
                for v in ("faithful", "unfaithful", "unknown", "unsure")
            }
            for source in ("inline", "shadow")
        },
        "rows": rows,
    }


async def sampled_counts(share: float, requests: int) -> dict[str, Any]:
    async with running_judge_server(create_judge_app({"unfaithful": []})) as judge_url:
        settings = Settings(upstream_url="http://vllm.test", judges=[_judge(judge_url)], shadow_share=share)
        app = create_app(settings, upstream_transport=FakeUpstream().transport())
        body = {"model": "m", "messages": [{"role": "user", "content": "What is in the image?"}], "stream": True}
        async with running_app(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as http:
            for _ in range(requests):
                await http.post("/v1/chat/completions", json=body, headers={"x-faithproxy-mode": "off"})
            await app.state.faithproxy.shadow.drained()
            text = (await http.get("/metrics")).text
    outcomes = ("not_sampled", "checked", "queue_full", "over_budget", "unreadable", "failed")
    counts = {o: metric(text, "faithproxy_shadow_requests_total", outcome=o) for o in outcomes}
    drawn = int(sum(v for o, v in counts.items() if o != "not_sampled"))
    low, high = binomial_interval(requests, share)
    return {
        "share": share,
        "requests": requests,
        "outcomes": counts,
        "drawn": drawn,
        "binomial_99.9": [low, high],
        "within": low <= drawn <= high and counts["checked"] == drawn,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20, help="ShapesWorld items (half of seed 997, half of 999)")
    parser.add_argument("--share", type=float, default=0.3)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--model", default=str(WEIGHTS_DIR))
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--doors", default="", help="other doors read the same way, e.g. responses,messages")
    args = parser.parse_args(argv)
    started = time.time()
    result: dict[str, Any] = {"command": "python -m faithproxy.benchmarks.performance.shadow_proof " + " ".join(
        sys.argv[1:] if argv is None else argv)}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        with start_vllm(args.model, served_model_name=SERVED_NAME, log_path=Path(tmp) / "vllm.log") as vllm:
            result["same_chains"] = asyncio.run(same_chains(vllm.base_url, args.n))
            doors = [d for d in args.doors.split(",") if d]
            if doors:
                result["doors"] = {d: asyncio.run(same_chains(vllm.base_url, args.n, d)) for d in doors}
    result["sampling"] = asyncio.run(sampled_counts(args.share, args.requests))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    result |= {
        "commit": commit,
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
    keys = ("items", "same_chains", "chains_with_equal_steps", "detect", "shadow", "equal", "metrics")
    summary = {k: result["same_chains"][k] for k in keys}
    doors = {d: {k: r[k] for k in keys + ("shadow_outcomes",)} for d, r in result.get("doors", {}).items()}
    print(json.dumps({"same_chains": summary, "doors": doors, "sampling": result["sampling"]}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
