"""The OpenAPI description lists the detectors this server serves, asked of their capabilities."""

from __future__ import annotations

from typing import Any

from faithproxy.clients.judges import JudgeConfig
from faithproxy.server.doors.schema import chat_parameters
from faithproxy.server.settings import Settings

JUDGE = JudgeConfig(name="claude", backend="anthropic", model="m", api_key="k")


def detector_enum(parameters: list[dict[str, Any]]) -> list[str]:
    (header,) = [p for p in parameters if p["name"] == "x-faithproxy-detector"]
    return header["schema"]["enum"]


def test_without_judges_the_detectors_that_use_one_are_not_offered() -> None:
    assert detector_enum(chat_parameters(Settings())) == ["consistency", "none", "probe", "prompt"]
    with_judge = ["cascade", "consistency", "judge", "none", "probe", "prompt", "routed"]
    assert detector_enum(chat_parameters(Settings(judges=[JUDGE]))) == with_judge


def test_a_running_server_offers_what_it_built() -> None:
    assert detector_enum(chat_parameters(Settings(judges=[JUDGE]), ["none", "judge"])) == ["judge", "none"]


def test_openapi_of_a_started_app_lists_its_built_detectors() -> None:
    from fastapi.testclient import TestClient

    from faithproxy.server.app import create_app

    settings = Settings(upstream_url="http://127.0.0.1:9", upstream_connect_timeout_s=0.2)
    with TestClient(create_app(settings)) as client:  # no judges, no probe: only these three are built
        operation = client.get("/openapi.json").json()["paths"]["/v1/chat/completions"]["post"]
    assert detector_enum(operation["parameters"]) == ["consistency", "none", "prompt"]
