#!/usr/bin/env bash
# Prints, as JSON, the size of each image scripts/build_images.sh builds (and of the base), with each
# image's largest layers and the Dockerfile step that made them. For a result file:
#   .venv/bin/python -m faithproxy.benchmarks.record --out benchmarks/results/docker-images.json -- bash scripts/image_sizes.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=$(bash scripts/docker_base.sh)
python3 - "$BASE" <<'PY'
import json, subprocess, sys

def docker(*args):
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout

tags = [sys.argv[1], "faithproxy:0.1.0", "faithproxy-vllm-cpu:0.1.0", "faithproxy-vllm-router:0.1.17",
        "faithproxy-local/prometheus:debian", "faithproxy-local/redis:debian"]
out = {}
for tag in tags:
    try:
        size = int(docker("image", "inspect", "-f", "{{.Size}}", tag))
    except subprocess.CalledProcessError:
        continue
    layers = []
    for line in docker("history", "--no-trunc", "--human=false", "--format", "{{.Size}}\t{{.CreatedBy}}", tag).splitlines():
        layer_size, created_by = line.split("\t", 1)
        layers.append({"bytes": int(layer_size), "step": " ".join(created_by.split())[:200] or "(the base)"})
    layers.sort(key=lambda layer: -layer["bytes"])
    out[tag] = {"bytes": size, "mb": round(size / 1e6), "largest_layers": layers[:4]}
# what fills the vLLM image: its venv's largest packages, in MB
vllm = "faithproxy-vllm-cpu:0.1.0"
if vllm in out:
    listing = docker("run", "--rm", "--entrypoint", "sh", vllm, "-c",
                     "du -sm /opt/venv/lib/python3*/site-packages/* | sort -rn | head -8")
    out[vllm]["largest_packages_mb"] = {
        line.split("\t")[1].rsplit("/", 1)[1]: int(line.split("\t")[0]) for line in listing.splitlines()
    }
print(json.dumps({"base": sys.argv[1], "images": out}, indent=2))
PY
