"""Image references (faithcore/images.py): exact for well-formed URLs, PolicyError for anything else."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faithproxy.faithcore.errors import PolicyError
from faithproxy.faithcore.images import ImageRef, image_parts, images_in_messages, last_user_text, parse_image_url

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url"]) | st.text(max_size=5)},
    optional={"text": JSON, "image_url": JSON | st.fixed_dictionaries({"url": JSON})},
)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant"]) | JSON},
        optional={"content": JSON | st.lists(PART | JSON, max_size=4)},
    ),
    max_size=4,
)


@given(raw=st.binary(max_size=300), media=st.sampled_from(["image/png", "image/jpeg", ""]))
def test_data_urls_hash_their_bytes_and_keep_the_payload(raw: bytes, media: str) -> None:
    payload = base64.b64encode(raw).decode()
    ref = parse_image_url(f"data:{media};base64,{payload}")
    assert ref.sha256 == hashlib.sha256(raw).hexdigest()
    assert ref.base64_data == payload and ref.is_data_url
    assert ref.media_type == (media or "application/octet-stream")


@given(rest=st.text(max_size=60), scheme=st.sampled_from(["http://", "https://"]))
def test_http_urls_are_hashed_by_their_text(rest: str, scheme: str) -> None:
    ref = parse_image_url(scheme + rest)
    assert ref.sha256 == hashlib.sha256((scheme + rest).encode()).hexdigest() and not ref.is_data_url


@given(url=st.text(max_size=80) | st.text(max_size=40).map(lambda t: "data:image/png;base64," + t))
def test_any_text_is_an_image_ref_or_a_policy_error(url: str) -> None:
    try:
        ref = parse_image_url(url)
    except PolicyError as exc:
        assert exc.param == "messages"
        return
    assert isinstance(ref, ImageRef) and len(ref.sha256) == 64


@given(messages=MESSAGES)
def test_message_walkers_take_any_json(messages: list[dict[str, Any]]) -> None:
    """The walkers see the client's messages after only a shallow check: any shape must give a result
    (or a PolicyError for a bad image), never a crash that would become a 500."""
    assert isinstance(last_user_text(messages), str)
    assert all(isinstance(p, dict) for p in image_parts(messages))
    try:
        images = images_in_messages(messages)
    except PolicyError:
        return
    assert len(images) == len(image_parts(messages))


def test_last_user_text_skips_non_text_parts() -> None:
    content = [{"type": "text", "text": "What"}, {"type": "text", "text": 7}, {"type": "text"}, {"type": "image_url"}]
    assert last_user_text([{"role": "user", "content": content}]) == "What"


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "data:image/png,notbase64", "data:image/png;base64,@@@", "ftp://x"]
)
def test_refused(url: str) -> None:
    with pytest.raises(PolicyError):
        parse_image_url(url)
