"""Images end to end over HTTP (issue #36): the tiny Gemma 3 vision model (models/tiny_vision.py)
served in this process, pictures made with Pillow and sent by the real OpenAI and Anthropic SDKs
(chat `image_url` data: URLs, Anthropic base64 `image` blocks, an image in a `tool_result`, a
Responses `function_call_output` with an `input_image`: Codex's `view_image`). The same image in
the next turn reuses the whole previous turn without the vision tower; another picture of the
same size at the same place reuses nothing past its first token, and says so; the same picture in
a new agent reuses its prefix; the image's tokens are counted in `prompt_tokens`."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import httpx
import pytest
from PIL import Image
from typer.testing import CliRunner

from agent_memory.chat.images import ChatImage

from agent_memory.models.tiny_vision import build_tiny_vision
from agent_memory.cli.cache.commands import cache_app
from tests.support.images import b64, data_url, encoded, picture
from tests.support.inprocess import InProcessServer
from tests.support.metrics import metric
from tests.support.services import RedisServer
from tests.support.vision import image_start, settle

DOCS = Path(__file__).resolve().parent.parent / "docs" / "usage.md"
MODEL = "gemma3"
IMAGE_TOKENS = 4  # the tiny Gemma 3's tokens an image (a real one's: 256)
RED, BLUE = encoded(picture(seed=1)), encoded(picture(seed=2))  # the same size: the same token ids


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_vision(tmp_path_factory.mktemp("models") / MODEL, arch="gemma3")


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    with InProcessServer(folder, tmp_path_factory.mktemp("cache"), "--disk-budget-mb", "0") as s:
        yield s


def tower_runs(server) -> float:
    return metric(server, "agent_memory_vision_tower_runs_total")


def look(png: bytes, question: str = "What is in this picture?") -> list[dict]:
    """A chat user message: the picture (a data: URL), then a question."""
    parts = [{"type": "image_url", "image_url": {"url": data_url(png)}}, {"type": "text", "text": question}]
    return [{"role": "user", "content": parts}]


def chat(server, messages: list[dict], agent: str):
    """One greedy chat turn of `agent` through the OpenAI SDK, once the engine is idle (a turn's
    follow-up, its reply as the template writes it back, has then been kept)."""
    settle(server)
    return server.client().chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0, extra_body={"prompt_cache_key": agent}
    )


def logged(server, text: str) -> str:
    """The access log line holding `text` (written just after its response is sent)."""
    deadline = time.monotonic() + 30
    while not (lines := [x for x in server.log().splitlines() if "agent_memory.requests" in x and text in x]):
        assert time.monotonic() < deadline, f"no access log line with {text!r}"
        time.sleep(0.05)
    return lines[-1]


def digest(png: bytes) -> str:
    return ChatImage.of(Image.open(io.BytesIO(png)).convert("RGB"), "").digest


def cached(response) -> int:
    return response.usage.prompt_tokens_details.cached_tokens


def miss(response) -> dict:
    return response.usage.prompt_tokens_details.model_extra["cache_miss"]


def test_models_says_the_model_takes_images_and_within_which_limits(server):
    (model,) = httpx.get(server.base_url + "/v1/models").json()["data"]
    assert model["input"] == ["text", "image"]
    limits = {"max_images": 16, "max_image_bytes": 10 << 20, "max_image_pixels": 1 << 25, "urls": False}
    assert model["image_limits"] == limits  # the defaults


def test_the_image_tokens_are_counted_in_prompt_tokens_the_log_and_metrics(server):
    question = [{"role": "user", "content": "What is in this picture?"}]
    images = metric(server, "agent_memory_prompt_images_total")
    with_image, without = chat(server, look(RED), "counted"), chat(server, question, "counted text")
    # the placeholder's own tokens, expanded to the image's: at least its 4 tokens more
    assert with_image.usage.prompt_tokens >= without.usage.prompt_tokens + IMAGE_TOKENS
    assert "images=1" in logged(server, f"prompt_tokens={with_image.usage.prompt_tokens} ")
    assert metric(server, "agent_memory_prompt_images_total") == images + 1  # its settle is not a prompt received


def test_chat_the_same_image_next_turn_reuses_the_whole_turn_without_the_tower(server):
    first = chat(server, look(RED), "returning")
    runs = tower_runs(server)
    history = look(RED) + [{"role": "assistant", "content": first.choices[0].message.content}]
    second = chat(server, history + [{"role": "user", "content": "And its colour?"}], "returning")
    assert cached(second) >= first.usage.prompt_tokens + first.usage.completion_tokens  # the reply too
    assert tower_runs(server) == runs  # the image's tokens came from memory


def test_chat_another_image_of_the_same_size_reuses_nothing_past_its_first_token(server):
    red = chat(server, look(RED, "Describe it."), "red")
    runs = tower_runs(server)
    blue = chat(server, look(BLUE, "Describe it."), "blue")
    assert blue.usage.prompt_tokens == red.usage.prompt_tokens  # the same token ids
    start = image_start(server, [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}])
    assert cached(blue) <= start
    assert tower_runs(server) == runs + 1  # blue's own pixels through the tower


def test_chat_the_same_agent_sending_another_image_misses_at_the_image(server):
    ask = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which one?"}]}]
    red = chat(server, look(RED, "Which one?"), "changed its mind")
    blue = chat(server, look(BLUE, "Which one?"), "changed its mind")
    start = image_start(server, ask)
    assert cached(blue) <= start
    assert miss(blue) == {
        "reason": "another_image",
        "at": cached(blue),
        "lost": red.usage.prompt_tokens - 1 - cached(blue),  # the memory held the prompt, but its last token
        "detail": {"cached": digest(RED), "sent": digest(BLUE), "image_at": str(start)},
    }
    assert "images=1" in logged(server, f"miss=another_image@{cached(blue)}")


def test_chat_the_same_image_in_a_new_agent_reuses_its_prefix(server):
    first = chat(server, look(RED, "Name its colours."), "first agent")
    runs = tower_runs(server)
    other = chat(server, look(RED, "Name its colours."), "second agent")
    start = image_start(server, [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}])
    assert cached(other) > start + IMAGE_TOKENS  # past the image: its KV shared
    assert other.usage.prompt_tokens == first.usage.prompt_tokens and tower_runs(server) == runs


def test_chat_a_tool_call_after_an_image_is_kept_as_the_template_writes_it_back(server):
    """The turn is settled (api/serving/settle.py) with its images: the next request, which
    renders the call its own way, reuses the whole turn, past the call."""
    nothing = {"type": "object", "properties": {}, "additionalProperties": False}
    zoom = {"name": "zoom", "description": "Zoom in.", "parameters": nothing}
    tools = [{"type": "function", "function": zoom}]
    ask, agent = look(RED, "Zoom in."), {"prompt_cache_key": "zooming"}
    first = server.client().chat.completions.create(
        model=MODEL, messages=ask, tools=tools, tool_choice="required", max_tokens=40, temperature=0, extra_body=agent
    )
    (call,) = first.choices[0].message.tool_calls
    runs = tower_runs(server)
    result = {"role": "tool", "tool_call_id": call.id, "content": "done"}
    answered = [first.choices[0].message.model_dump(exclude_none=True), result]
    settle(server)
    second = server.client().chat.completions.create(
        model=MODEL, messages=ask + answered, tools=tools, max_tokens=4, temperature=0, extra_body=agent
    )
    assert cached(second) >= first.usage.prompt_tokens + first.usage.completion_tokens
    assert miss(second)["reason"] == "none" and tower_runs(server) == runs


def test_chat_two_images_in_one_message_are_each_in_the_key(server):
    """Several images in one message, of two sizes: the same two next turn reuse the whole turn with
    no tower and answer as with nothing cached; the same two swapped reuse nothing past the first."""
    wide = encoded(picture((48, 16), seed=3))

    def both(one: bytes, other: bytes) -> list[dict]:
        parts = [look(one)[0]["content"][0], {"type": "text", "text": "Compare it with"}, look(other)[0]["content"][0]]
        return [{"role": "user", "content": parts}]

    first = chat(server, both(RED, wide), "comparing")
    runs = tower_runs(server)
    history = both(RED, wide) + [{"role": "assistant", "content": first.choices[0].message.content}]
    history += [{"role": "user", "content": "Which is wider?"}]
    second = chat(server, history, "comparing")
    assert cached(second) >= first.usage.prompt_tokens + first.usage.completion_tokens
    assert tower_runs(server) == runs
    assert second.choices[0].message.content == server_answer(server, history, salt="comparing alone")
    swapped = chat(server, both(wide, RED), "comparing swapped")
    assert swapped.usage.prompt_tokens == first.usage.prompt_tokens
    start = image_start(server, [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}])
    assert cached(swapped) <= start


def unnamed(server, messages: list[dict]) -> tuple[str, dict]:
    """One greedy chat turn naming no agent: the unnamed conversation it joined (`X-Agent-Id`), its usage."""
    settle(server)
    body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.headers["X-Agent-Id"], r.json()


def test_an_unnamed_conversation_goes_on_with_the_same_image_and_not_with_another(server):
    """memory/index/conversations.py: a next turn with the same picture in its history continues
    the conversation; one with another picture of the same size (the same token ids) is a
    rewritten history, as another word would be: a new conversation, the first one left as it was."""
    ask = look(RED, "Which harbour is this?")
    conversation, first = unnamed(server, ask)
    assert conversation.startswith("~")
    reply = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
    same, second = unnamed(server, ask + [reply, {"role": "user", "content": "And the boats?"}])
    assert same == conversation
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"]
    unseen = encoded(picture(seed=5))  # of RED's size, sent nowhere else in this module
    other, third = unnamed(server, look(unseen, "Which harbour is this?") + [reply, {"role": "user", "content": "And the boats?"}])
    assert other != conversation
    start = image_start(server, [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}])
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] <= start
    again, _ = unnamed(server, ask + [reply, {"role": "user", "content": "And the boats?"}])
    assert again == conversation  # the first conversation was not moved to the other picture


def anthropic_client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def anthropic_turn(server, messages: list[dict], agent: str, **extra):
    settle(server)
    return anthropic_client(server).messages.create(
        model=MODEL, max_tokens=6, messages=messages, extra_body={"temperature": 0},
        extra_headers={"X-Agent-Id": agent}, **extra,
    )


def anthropic_image(png: bytes) -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(png)}}


def prompt_of(message) -> int:
    u = message.usage
    return u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens


def test_anthropic_the_same_image_next_turn_reuses_the_whole_turn(server):
    ask = [{"role": "user", "content": [anthropic_image(RED), {"type": "text", "text": "What is it?"}]}]
    first = anthropic_turn(server, ask, "claude")
    assert anthropic_client(server).messages.count_tokens(model=MODEL, messages=ask).input_tokens == prompt_of(first)
    runs = tower_runs(server)
    reply = {"role": "assistant", "content": first.content[0].text}
    second = anthropic_turn(server, ask + [reply, {"role": "user", "content": "Is it red?"}], "claude")
    assert second.usage.cache_read_input_tokens >= prompt_of(first) + first.usage.output_tokens
    assert tower_runs(server) == runs


def test_anthropic_an_image_in_a_tool_result_is_answered_and_reused_next_turn(server):
    call = {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [anthropic_image(BLUE)]}
    tools = [{"name": "screenshot", "description": "Take a screenshot.", "input_schema": {"type": "object"}}]
    history = [
        {"role": "user", "content": "Take a screenshot and describe it."},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    first = anthropic_turn(server, history, "shots", tools=tools)
    assert first.content and prompt_of(first) > IMAGE_TOKENS
    runs = tower_runs(server)
    answer = {"role": "assistant", "content": [b.model_dump() for b in first.content]}
    second = anthropic_turn(server, [*history, answer, {"role": "user", "content": "More?"}], "shots", tools=tools)
    assert second.usage.cache_read_input_tokens >= prompt_of(first) + first.usage.output_tokens
    assert tower_runs(server) == runs


def test_responses_a_view_image_output_is_answered_and_reused_next_turn(server):
    """Codex's `view_image`: the function's output is a list holding an `input_image`."""
    path = {"type": "object", "properties": {"path": {"type": "string"}}}
    tools = [{"type": "function", "name": "view_image", "parameters": path}]
    call = {"type": "function_call", "call_id": "call_1", "name": "view_image", "arguments": '{"path": "shot.png"}'}
    shot = [{"type": "input_image", "image_url": data_url(RED)}]
    output = {"type": "function_call_output", "call_id": "call_1", "output": shot}
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Look at shot.png."}]}, call, output]

    def turn(items):
        settle(server)
        return server.client().responses.create(
            model=MODEL, input=items, tools=tools, max_output_tokens=6, temperature=0, store=False,
            prompt_cache_key="codex",
        )

    first = turn(items)
    assert first.output and first.usage.input_tokens > IMAGE_TOKENS  # answered (cut at 6 tokens: incomplete)
    runs = tower_runs(server)
    answered = [o.model_dump(exclude_none=True) for o in first.output]
    user = {"role": "user", "content": [{"type": "input_text", "text": "And now?"}]}
    second = turn(items + answered + [user])
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens + first.usage.output_tokens
    assert tower_runs(server) == runs


def test_across_two_servers_on_redis_the_image_is_in_the_key(folder, tmp_path):
    """docs/scale-out.md with images: server A serves an agent's turn with a picture; server B, on
    the same Redis, serves the next turn from what A wrote there, the picture's blocks included,
    with no vision tower, and answers as with nothing cached; another picture of the same size on
    B reuses none of A's blocks."""
    ask = look(RED, "Where was this taken?")
    with RedisServer(tmp_path / "redis") as redis:
        with InProcessServer(folder, tmp_path / "a", "--warm-store", redis.url) as a:
            first = chat(a, ask, "travelling")
            settle(a)  # its turn settled; A's graceful stop flushes its writes to Redis
        history = ask + [{"role": "assistant", "content": first.choices[0].message.content}]
        history += [{"role": "user", "content": "And when?"}]
        with InProcessServer(folder, tmp_path / "b", "--warm-store", redis.url) as b:
            start = image_start(b, [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}])
            other = chat(b, look(BLUE, "Where was this taken?"), "another picture")
            assert other.usage.prompt_tokens == first.usage.prompt_tokens  # the same token ids
            assert cached(other) <= start and tower_runs(b) == 1
            second = chat(b, history, "travelling")
            warm = second.usage.prompt_tokens_details.model_extra["warm_tokens"]
            assert warm >= first.usage.prompt_tokens + first.usage.completion_tokens  # the reply too, from Redis
            assert tower_runs(b) == 1  # the picture's tokens came from A's blocks
            uncached = server_answer(b, history, salt="nothing shared")
    assert second.choices[0].message.content == uncached  # exact at 16 bits


def server_answer(server, messages: list[dict], salt: str) -> str:
    """A greedy answer computed from nothing cached (a cache salt of its own)."""
    settle(server)
    reply = server.client().chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0, extra_body={"cache_salt": salt}
    )
    assert cached(reply) == 0
    return reply.choices[0].message.content


def test_beside_a_text_model_unloaded_and_back_a_vision_model_keeps_its_images(folder, tiny_model, tmp_path):
    """Several models (docs/usage.md "Several models"): the text model refuses the image the vision
    model beside it answers; idle, both unload (`--unload-idle-s 1`), and the vision model's next
    turn loads it back, its vision tower with it: the image's turn is read back warm, and a new
    picture goes through the reloaded tower."""
    with InProcessServer(folder, tmp_path / "cache", "--model", f"tiny={tiny_model}", "--unload-idle-s", "1") as s:
        first = chat(s, look(RED), "coming back")
        text_only = {"model": "tiny", "messages": look(RED), "max_tokens": 4}
        refused = httpx.post(s.base_url + "/v1/chat/completions", json=text_only, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "images_not_supported"
        deadline = time.monotonic() + 60
        while any(m["loaded"] for m in httpx.get(s.base_url + "/health").json()["models"]):
            assert time.monotonic() < deadline, "the models did not unload"
            time.sleep(0.1)
        history = look(RED) + [{"role": "assistant", "content": first.choices[0].message.content}]
        second = chat(s, history + [{"role": "user", "content": "Still there?"}], "coming back")
        details = second.usage.prompt_tokens_details.model_extra
        assert details["hot_tokens"] == 0 and details["warm_tokens"] >= first.usage.prompt_tokens
        runs = tower_runs(s)
        assert chat(s, look(encoded(picture(seed=9))), "a new picture").usage.completion_tokens > 0
        assert tower_runs(s) == runs + 1


def test_cache_show_says_which_blocks_cover_which_image(folder, tmp_path):
    cache = tmp_path / "cache"
    with InProcessServer(folder, cache) as s:  # a warm folder: written by the time it stops
        chat(s, look(RED, "Keep this one."), "album")
    run = lambda *args: CliRunner().invoke(cache_app, ["show", "album", "--cache-dir", str(cache), *args])  # noqa: E731
    shown = json.loads(run("--format", "json").output)
    (image,) = shown["images"]
    assert image["digest"] == digest(RED) and image["end"] - image["start"] == IMAGE_TOKENS
    covering = [b for b in shown["blocks"] if b["start"] < image["end"] and b["start"] + b["tokens"] > image["start"]]
    assert covering and all(b["images"] == [digest(RED)] for b in covering)
    assert all(b["images"] == [] for b in shown["blocks"] if b not in covering)
    human = run().output
    assert f"1 image (SHA-256 of its pixels, tokens): {digest(RED)[:12]} at {image['start']}-" in human
    assert "images" in human.splitlines()[4]  # the blocks' table has the column
    pixels = Image.open(io.BytesIO(RED)).convert("RGB").tobytes()
    written = [f.read_bytes() for f in cache.rglob("*") if f.is_file()]  # the warm folder, the log
    assert written and not any(x in w for w in written for x in (RED, b64(RED).encode(), pixels))  # no image on disk


def test_the_usage_docs_image_examples_answer_with_a_vision_model(server):
    """docs/usage.md "Images": its OpenAI and Anthropic examples, run as written (the docs' URL and
    model made this server's), answer instead of printing the 400 a text-only model gives."""
    section = DOCS.read_text().split("\n## Images\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)
    assert len(blocks) == 2
    for code in blocks:
        code = code.replace("http://127.0.0.1:8000", server.base_url).replace('"demo"', f'"{MODEL}"')
        ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr
        assert "images_not_supported" not in ran.stdout and "takes no images" not in ran.stdout
