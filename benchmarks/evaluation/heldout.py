"""The held-out protocol: options frozen in a committed file first, each held-out seed evaluated once.

    faithproxy bench heldout freeze --seed 27191 --n 300 --detectors judge:pixels,... \
        --out benchmarks/results/heldout/shapesworld-27191.options.json
    git add benchmarks/results/heldout/shapesworld-27191.options.json && git commit ...
    bash benchmarks/clean_worktree.sh faithproxy bench heldout run \
        benchmarks/results/heldout/shapesworld-27191.options.json

Seeds 997 and 999 are development seeds: checkpoints, thresholds, `REGENERATION_SAMPLES` and the other
options were chosen on their runs, so their figures flatter the choices. A held-out seed is one no
training stream and no earlier run drew (10,000 to 299,999: the tasks' item seeds of training seeds
below 3,000 stay under 10,000, the judge's and the drills' start at 300,000), picked before any run on it.

`freeze` writes every option of the run and every proxy setting (`Settings()`, as the environment
gives them) with the sha256 of the models and of the probe. `run` refuses unless that file is
committed unchanged, the tracked tree is clean, today's settings and files hash as frozen, and no result
for the seed exists yet; `--rerun` runs again anyway and labels the result a rerun (a new file, the
first result kept). The result records the command, the commit, the date and the machine, and is
committed whatever it shows. A run that was stopped resumes: started again with the same frozen file
(the preflight checks still hold), it reads back the parts it had finished (vanilla, each row) from its
workdir (`var/bench-heldout/<name>/`) and runs the rest; `protocol.resumed_parts` names them.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from faithproxy.benchmarks.evaluation.shapesworld_rows import parse_row

HELDOUT_DIR = Path("benchmarks/results/heldout")
DEVELOPMENT_SEEDS = (997, 999)
FIRST_HELDOUT_SEED = 10_000
END_HELDOUT_SEEDS = 300_000  # judge_corpus.JUDGE_SEED_BASE: the judge's training items start here
FORMAT = "faithproxy-heldout-options/1"


class ProtocolError(Exception):
    """The run would break the protocol; printed without a traceback, exit status 2."""


# ----------------------------------------------------------------------------------------- records


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_digest(options: dict[str, Any]) -> dict[str, str]:
    """sha256 of the generator's and judge's weights and of the probe file the options name."""
    out = {
        "model": sha256_of(Path(options["model"]) / "model.safetensors"),
        "judge_model": sha256_of(Path(options["judge_model"]) / "model.safetensors"),
    }
    if options.get("probe"):
        out["probe"] = sha256_of(Path(options["probe"]))
    return out


def proxy_settings() -> dict[str, Any]:
    """Every proxy setting as `Settings()` reads it here (secrets masked by pydantic)."""
    from faithproxy.server.settings import Settings

    return Settings().model_dump(mode="json")


def machine() -> dict[str, Any]:
    """Cores, memory, GPU (none unless nvidia-smi answers) and load when the run starts."""
    memory = None
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal:"):
                memory = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        gpu = None
    return {
        "cpus": os.cpu_count(),
        "memory_gib": memory,
        "gpu": gpu,
        "platform": platform.platform(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_seed(seed: int) -> None:
    if seed in DEVELOPMENT_SEEDS:
        raise ProtocolError(f"seed {seed} is a development seed (options were chosen on it): not held out")
    if not FIRST_HELDOUT_SEED <= seed < END_HELDOUT_SEEDS:
        raise ProtocolError(
            f"a held-out seed is in {FIRST_HELDOUT_SEED}..{END_HELDOUT_SEEDS - 1}: no training stream draws those"
        )


def result_path(options_path: Path, rerun: int = 0) -> Path:
    """`X.options.json` → `X.json`; a rerun → `X.rerun-N.json`."""
    stem = options_path.name.removesuffix(".options.json")
    return options_path.with_name(f"{stem}.json" if not rerun else f"{stem}.rerun-{rerun}.json")


# ------------------------------------------------------------------------------------------ freeze


def freeze(args: argparse.Namespace) -> dict[str, Any]:
    check_seed(args.seed)
    if args.n < 5 or args.n % 5:
        raise ProtocolError("--n must be a positive multiple of 5 (questions cycle through five types)")
    for name in args.detectors.split(","):
        parse_row(name)
    options = {
        "model": str(args.model),
        "judge_model": str(args.judge_model),
        "probe": str(args.probe) if args.probe else None,
        "seed": args.seed,
        "start": 0,
        "n": args.n,
        "detectors": args.detectors,
        "cascade_low": args.cascade_low,
        "cascade_high": args.cascade_high,
        "cascade_rewrites": args.cascade_rewrites,
        "max_retries": args.max_retries,
        "regeneration_samples": args.regeneration_samples,
        "concurrency": args.concurrency,
    }
    if any(parse_row(d).reads_hidden_states for d in args.detectors.split(",")) and not args.probe:
        raise ProtocolError("rows reading hidden states need --probe")
    return {
        "format": FORMAT,
        "frozen_at": now(),
        "frozen_at_commit": _git("rev-parse", "HEAD").strip(),
        "why": args.why,
        "options": options,
        "files_sha256": files_digest(options),
        "settings": proxy_settings(),
    }


# --------------------------------------------------------------------------------------------- run


def preflight(options_path: Path, frozen: dict[str, Any], rerun: bool) -> int:
    """The rerun number (0: the first run), or ProtocolError when the run would break the protocol."""
    if frozen.get("format") != FORMAT:
        raise ProtocolError(f"{options_path}: not a frozen options file ({FORMAT})")
    check_seed(frozen["options"]["seed"])
    if not _git("ls-files", "--", str(options_path)).strip():
        raise ProtocolError(f"{options_path} is not committed: commit it before the run")
    if _git("status", "--porcelain", "--untracked-files=no").strip():
        raise ProtocolError("tracked files differ from the commit: run from a clean tree (e.g. a git worktree)")
    if frozen["settings"] != proxy_settings():
        changed = sorted(k for k, v in proxy_settings().items() if frozen["settings"].get(k) != v)
        raise ProtocolError(f"proxy settings differ from the frozen ones: {', '.join(changed)}")
    if frozen["files_sha256"] != files_digest(frozen["options"]):
        raise ProtocolError("a model or the probe file differs from the frozen sha256")
    done = 0
    while result_path(options_path, done).exists():
        done += 1
    if done and not rerun:
        raise ProtocolError(f"{result_path(options_path)} exists: the seed was evaluated; --rerun labels a rerun")
    return done


def run(options_path: Path, rerun: bool, workdir: Path) -> Path:
    from faithproxy.benchmarks.evaluation.shapesworld_bench import benchmark, markdown, write_result
    from faithproxy.detectors.probe import Probe

    frozen = json.loads(options_path.read_text(encoding="utf-8"))
    number = preflight(options_path, frozen, rerun)
    o = frozen["options"]
    detectors = o["detectors"].split(",")
    probe = Path(o["probe"]) if o["probe"] else None
    layers = None
    if probe is not None and any(parse_row(d).reads_hidden_states for d in detectors):
        layers = frozen["settings"]["hidden_states_layers"] or Probe.load(probe).layers
    if o["cascade_rewrites"] is not None:
        os.environ["FAITHPROXY_CASCADE_REWRITES"] = o["cascade_rewrites"]
    # Parts (vanilla, each row) finished by an earlier start of this same frozen run are kept and read
    # back: a run stopped half-way goes on from its last finished part, and the record says so.
    workdir = workdir / options_path.name.removesuffix(".options.json")
    found = sorted(p.name for p in workdir.glob("raw-*.json")) if workdir.is_dir() else []
    started, host = now(), machine()
    result = benchmark(
        Path(o["model"]),
        o["n"],
        detectors,
        o["concurrency"],
        workdir,
        o["max_retries"],
        o["regeneration_samples"],
        o["seed"],
        start=o["start"],
        judge_model=Path(o["judge_model"]),
        probe_path=probe,
        hidden_layers=layers,
        cascade=(o["cascade_low"], o["cascade_high"]),
        resume=True,
    )
    result.pop("labelled")
    host["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out = result_path(options_path, number)
    result |= {
        "left_out": {},
        "command": f"faithproxy bench heldout run {options_path}" + (" --rerun" if rerun else ""),
        "protocol": {
            "options_file": str(options_path),
            "options_sha256": sha256_of(options_path),
            "run": "first" if number == 0 else f"rerun {number}",
            "started": started,
            "finished": now(),
            # parts an earlier, stopped start of this run had finished (read back, not run again)
            "resumed_parts": found,
        },
        "date": started,
        "machine": host,
    }
    write_result(result, out)
    print(markdown(result))
    return out


# --------------------------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    f = sub.add_parser("freeze", help="write the frozen options file of a held-out run (commit it, then run)")
    f.add_argument(
        "--seed", type=int, required=True, help=f"a new seed in {FIRST_HELDOUT_SEED}..{END_HELDOUT_SEEDS - 1}"
    )
    f.add_argument("--n", type=int, required=True, help="chains (a multiple of 5)")
    f.add_argument("--detectors", required=True, help="rows, as `faithproxy bench shapesworld --detectors`")
    f.add_argument("--model", type=Path, default=Path("benchmarks/shapesworld/model/weights"))
    f.add_argument("--judge-model", type=Path, default=Path("benchmarks/shapesworld/model/judge_weights"))
    f.add_argument("--probe", type=Path)
    f.add_argument("--cascade-low", type=float, default=None)
    f.add_argument("--cascade-high", type=float, default=None)
    f.add_argument("--cascade-rewrites", choices=("cascade", "judge"), default=None)
    f.add_argument("--max-retries", type=int, default=3)
    f.add_argument("--regeneration-samples", type=int, default=None, help="default: the settings'")
    f.add_argument("--concurrency", type=int, default=8)
    f.add_argument("--why", default="", help="what the run is for (kept in the file)")
    f.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run", help="run a committed frozen options file once; the result goes beside it")
    r.add_argument("options", type=Path)
    r.add_argument("--rerun", action="store_true", help="the seed was evaluated: run again, labelled a rerun")
    r.add_argument("--workdir", type=Path, default=Path("var/bench-heldout"))


def main(args: argparse.Namespace) -> int:
    """`faithproxy bench heldout` (benchmarks/evaluation/cli.py)."""
    try:
        if args.action == "freeze":
            frozen = freeze(args)
            settings = frozen["settings"]
            o = frozen["options"]
            o["cascade_low"] = settings["cascade_low"] if o["cascade_low"] is None else o["cascade_low"]
            o["cascade_high"] = settings["cascade_high"] if o["cascade_high"] is None else o["cascade_high"]
            o["cascade_rewrites"] = o["cascade_rewrites"] or settings["cascade_rewrites"]
            o["regeneration_samples"] = o["regeneration_samples"] or settings["regeneration_samples"]
            if args.out.exists():
                raise ProtocolError(f"{args.out} exists: a frozen file is never rewritten")
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(frozen, indent=2) + "\n", encoding="utf-8")
            print(f"frozen: {args.out}; commit it, then `faithproxy bench heldout run {args.out}`")
        else:
            print(run(args.options, args.rerun, args.workdir))
    except ProtocolError as exc:
        print(f"faithproxy bench heldout: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    cli = argparse.ArgumentParser(prog="python -m faithproxy.benchmarks.evaluation.heldout", description=__doc__)
    add_arguments(cli)
    sys.exit(main(cli.parse_args()))
