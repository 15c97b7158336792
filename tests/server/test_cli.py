"""The console script's offline sub-commands, run as a user would (a subprocess)."""

import json
import subprocess
import sys

from faithproxy.faithcore.kinds import classify_step
from faithproxy.faithcore.segmenter import segment_text

CHAIN = (
    "<think>\nThe image shows a red car, e.g. a sedan. It is 3.5 m long.\n\n1. First item.\n</think>\n\n"
    "The answer is B."
)


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "faithproxy.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_segment_prints_one_json_object_per_step_like_the_server() -> None:
    lines = [json.loads(line) for line in run("segment", stdin=CHAIN).stdout.splitlines()]
    expected = [s.text for s in segment_text(CHAIN) if s.text]
    assert [line["text"] for line in lines] == expected
    assert [line["index"] for line in lines] == list(range(len(expected)))
    assert expected == [
        "The image shows a red car, e.g. a sedan.",
        "It is 3.5 m long.",
        "1. First item.",
        "The answer is B.",
    ]


def test_segment_prints_the_kind_the_step_typer_gives_each_step() -> None:
    chain = "Okay, let me look at the chart. The bar for 2020 reaches about 45. So the answer is B."
    lines = [json.loads(line) for line in run("segment", stdin=CHAIN + "\n" + chain).stdout.splitlines()]
    assert [line["kind"] for line in lines] == [classify_step(line["text"]).value for line in lines]
    assert [(line["text"], line["kind"]) for line in lines] == [
        ("The image shows a red car, e.g. a sedan.", "perception"),
        ("It is 3.5 m long.", "perception"),
        ("1. First item.", "reasoning"),
        ("The answer is B.", "reasoning"),
        ("Okay, let me look at the chart.", "reasoning"),
        ("The bar for 2020 reaches about 45.", "perception"),
        ("So the answer is B.", "reasoning"),
    ]


def test_detectors_lists_registry() -> None:
    names = [line.split()[0] for line in run("detectors").stdout.splitlines()]
    assert names == ["judge", "prompt", "none", "probe", "cascade", "consistency", "routed"]
