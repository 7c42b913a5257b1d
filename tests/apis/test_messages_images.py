"""Images through the Messages API: a base64 image of a type Anthropic does not take (SVG, a PDF,
a made-up type) is refused as Anthropic refuses it, a 400 naming `source.media_type` in
Anthropic's error shape, never spliced into a data URL as it came; the four image types pass.
Official `anthropic` client -> gateway -> the project's simulator, on loopback."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import anthropic
import pytest

from loadtests.simulator.testing import run_fleet
from tests.support import GatewayServer

DATA = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


@pytest.fixture(scope="module")
def client() -> Iterator[anthropic.Anthropic]:
    with run_fleet([{"name": "a", "profile": "fast"}]) as fleet:
        text = f"""
providers:
  a: {{base_url: '{fleet.url("a")}', models: {{'*': sim}}, simulated: true}}
pools:
  p: {{members: [a]}}
models:
  chat: {{pool: p}}
"""
        with GatewayServer(text) as gw:
            yield anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)


def _image(media: str) -> list[dict[str, object]]:
    source = {"type": "base64", "media_type": media, "data": DATA}
    block = {"type": "image", "source": source}
    return [{"role": "user", "content": [block, {"type": "text", "text": "what is it?"}]}]


@pytest.mark.parametrize("media", ["image/jpeg", "image/png", "image/gif", "image/webp"])
def test_the_four_image_types_pass(client: anthropic.Anthropic, media: str) -> None:
    msg = client.messages.create(model="chat", max_tokens=5, messages=_image(media))  # type: ignore[arg-type]
    assert msg.content and msg.content[0].type == "text"


@pytest.mark.parametrize(
    "media", ["image/svg+xml", "application/pdf", "image/png;base64,AAAA#", "IMAGE/PNG", ""]
)
def test_another_media_type_is_refused_as_anthropic_does(
    client: anthropic.Anthropic, media: str
) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="chat", max_tokens=5, messages=_image(media))  # type: ignore[arg-type]
    body = e.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "messages.0.content.0.source.media_type" in body["error"]["message"]
