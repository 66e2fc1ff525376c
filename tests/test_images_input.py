"""Images in requests (issue #36, the API side): image parts read on every API (chat `image_url`,
Anthropic `image` blocks and `tool_result` content, Responses `input_image` and
`function_call_output` content) into the Conversation, decoded and checked against the
operator's limits, rendered as the model's image placeholders by real published vision chat
templates; every bad one a 400 in the API's own shape naming the part, a stream refused before it
starts. The server here serves the tiny text-only model, so a good image is refused too: the
model takes none."""

from __future__ import annotations

import asyncio
import http.server
import threading

import httpx
import pytest
from PIL import Image
from transformers.utils.chat_template_utils import render_jinja_template

from agent_memory.api.anthropic.conversation import conversation as anthropic_conversation
from agent_memory.api.anthropic.schemas import MessagesRequest
from agent_memory.api.openai.chat import conversation as chat_conversation
from agent_memory.api.openai.schemas import ChatCompletionRequest
from agent_memory.agent_key import AgentKey
from agent_memory.api.responses.conversation import input_messages
from agent_memory.api.responses.store import ResponseStore, StoredResponse, response_file
from agent_memory.chat.conversation import Conversation, Message, with_parts
from agent_memory.chat.images import ChatImage, ImageError, ImageLimits, ImageSource, decode, load
from agent_memory.chat.render import template_input
from tests.support.images import b64, data_url, encoded, picture, png_bomb
from tests.support.inprocess import InProcessServer
from tests.support.templates import DATA

PNG = encoded(picture())
MAX_IMAGES = 2


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    """The tiny text-only model, with small image limits (2 images, 1 MiB each)."""
    args = ("--max-images", str(MAX_IMAGES), "--max-image-mb", "1")
    with InProcessServer(tiny_model, tmp_path_factory.mktemp("cache"), *args) as s:
        yield s


def chat_body(*parts: dict, stream: bool = False) -> dict:
    content = [{"type": "text", "text": "What is this?"}, *parts]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]
    return {"model": "tiny", "messages": messages, "max_tokens": 4, "stream": stream}


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def image_url(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def anthropic_body(*blocks: dict, stream: bool = False) -> dict:
    content = [{"type": "text", "text": "What is this?"}, *blocks]
    return {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": content}], "stream": stream}


def anthropic_image(data: bytes, media_type: str = "image/png") -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": b64(data)}}


def responses_body(*parts: dict, stream: bool = False) -> dict:
    content = [{"type": "input_text", "text": "What is this?"}, *parts]
    return {"model": "tiny", "max_output_tokens": 4, "input": [{"role": "user", "content": content}], "stream": stream}


def input_image(url: str) -> dict:
    return {"type": "input_image", "image_url": url}


def refused(server, path: str, body: dict, where: str, says: str) -> dict:
    """A 400 in the API's own shape whose message names `where` and says `says`."""
    r = httpx.post(server.base_url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")  # a stream never started
    error = r.json()["error"]
    if path == "/v1/messages":
        assert r.json()["type"] == "error" and error["type"] == "invalid_request_error"
    else:
        assert error["param"] == where
    assert error["message"].startswith(f"{where}: ") and says in error["message"], error["message"]
    return error


# What each API is sent, and the path of the image part in it: chat, Anthropic, Responses.
def on_every_api(url: str, data: bytes, media_type: str = "image/png", stream: bool = False):
    return [
        ("/v1/chat/completions", chat_body(image_url(url), stream=stream), "messages.1.content.1"),
        ("/v1/messages", anthropic_body(anthropic_image(data, media_type), stream=stream), "messages.0.content.1"),
        ("/v1/responses", responses_body(input_image(url), stream=stream), "input.0.content.1"),
    ]


@pytest.mark.parametrize("stream", [False, True])
def test_a_good_image_to_a_text_only_model_is_refused_naming_it(served, stream):
    for path, body, where in on_every_api(data_url(PNG), PNG, stream=stream):
        error = refused(served, path, body, where, "takes no images")
        if path != "/v1/messages":
            assert error["code"] == "images_not_supported"


BAD = {
    "not an image": (b"plain text, no picture", "not an image of a format"),
    "bmp": (encoded(picture(), "BMP"), "not an image of a format"),
    "cut short": (PNG[: len(PNG) // 2], "cannot be decoded"),
    "decompression bomb": (png_bomb(), "over 33554432 pixels (the operator's --max-image-pixels)"),
    "over the pixel limit": (png_bomb(8000, 6000), "is 8000×6000, over 33554432 pixels"),
    "animated": (
        encoded(picture(), "GIF", save_all=True, append_images=[picture(seed=9)]),
        "animated image (2 frames)",
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_image_is_a_400_naming_its_part_on_every_api(served, name):
    data, says = BAD[name]
    for path, body, where in on_every_api(data_url(data), data):
        error = refused(served, path, body, where, says)
        if path != "/v1/messages":
            assert error["code"] == "invalid_image"


def test_a_bad_image_refuses_a_stream_before_it_starts(served):
    for path, body, where in on_every_api(data_url(png_bomb()), png_bomb(), stream=True):
        refused(served, path, body, where, "over")


def test_too_large_and_too_many_images_are_refused(served):
    large = encoded(picture((600, 600)), "BMP")  # 1.08 MB as sent: over --max-image-mb 1
    assert len(large) > 1 << 20
    for path, body, where in on_every_api(data_url(large, "image/bmp"), large, "image/bmp"):
        refused(served, path, body, where, "not one this server takes")  # BMP's media type: refused as named
    too_large = data_url(large)  # declared PNG: refused for its size before its format is looked at
    chat = "/v1/chat/completions"
    refused(served, chat, chat_body(image_url(too_large)), "messages.1.content.1", "at most 1048576 bytes")
    three = [image_url(data_url(encoded(picture(seed=i)))) for i in range(MAX_IMAGES + 1)]
    refused(served, chat, chat_body(*three), "messages.1.content.3", "at most 2 images, this one has 3")
    blocks = [anthropic_image(encoded(picture(seed=i))) for i in range(MAX_IMAGES + 1)]
    refused(served, "/v1/messages", anthropic_body(*blocks), "messages.0.content.3", "at most 2 images")


def test_urls_local_paths_and_file_ids_are_refused(served):
    for url, says in [
        ("http://127.0.0.1:9/cat.png", "does not fetch image URLs"),
        ("/etc/passwd", "local paths and other schemes are never read"),
        ("file:///etc/passwd", "local paths and other schemes are never read"),
        ("data:image/png,rawbytes", "data:<media type>;base64,<data>"),
        ("data:image/png;base64,%%%", "not valid base64"),
    ]:
        refused(served, "/v1/chat/completions", chat_body(image_url(url)), "messages.1.content.1", says)
        refused(served, "/v1/responses", responses_body(input_image(url)), "input.0.content.1", says)
    url_block = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    refused(served, "/v1/messages", anthropic_body(url_block), "messages.0.content.1", "does not fetch image URLs")

    no_files = "there is no files API"
    file_part = {"type": "file", "file": {"file_id": "file-abc"}}
    refused(served, "/v1/chat/completions", chat_body(file_part), "messages.1.content.1", no_files)
    file_block = {"type": "image", "source": {"type": "file", "file_id": "file_011"}}
    refused(served, "/v1/messages", anthropic_body(file_block), "messages.0.content.1", no_files)
    file_image = {"type": "input_image", "file_id": "file-abc"}
    refused(served, "/v1/responses", responses_body(file_image), "input.0.content.1", no_files)


def test_images_in_tool_results_are_read_and_checked(served):
    call = {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}
    shot = [text("shot:"), anthropic_image(b"junk")]
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": shot}
    body = {
        "model": "tiny",
        "max_tokens": 4,
        "tools": [{"name": "screenshot", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "Take one."},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
        ],
    }
    refused(served, "/v1/messages", body, "messages.2.content.0.content.1", "not an image")
    items = [
        {"role": "user", "content": "Look at it."},
        {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": '{"path": "a.png"}'},
        {"type": "function_call_output", "call_id": "c1", "output": [input_image(data_url(PNG))]},
    ]
    tools = [{"type": "function", "name": "view_image", "parameters": {"type": "object"}}]
    body = {"model": "tiny", "max_output_tokens": 4, "input": items, "tools": tools}
    refused(served, "/v1/responses", body, "input.2.output.0", "takes no images")


def test_images_are_taken_only_where_the_api_takes_them(served):
    assistant = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [image_url(data_url(PNG))]}]
    body = {"model": "tiny", "max_tokens": 4, "messages": [*assistant, {"role": "user", "content": "and?"}]}
    refused(served, "/v1/chat/completions", body, "messages.1.content.0", "taken in user messages, not assistant")
    audio = chat_body({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}})
    refused(served, "/v1/chat/completions", audio, "messages.1.content.1", "only text and image_url parts")
    said = {"role": "assistant", "content": [input_image(data_url(PNG))]}
    body = {"model": "tiny", "max_output_tokens": 4, "input": [{"role": "user", "content": "Hi"}, said]}
    refused(served, "/v1/responses", body, "input.1.content.0", "only text parts are taken here")


def test_models_say_a_text_only_model_takes_text(served):
    model = httpx.get(served.base_url + "/v1/models/tiny").json()
    assert model["input"] == ["text"] and "image_limits" not in model


# The parsing and the placeholders, without a server.


def test_every_api_reads_image_parts_into_the_conversation_in_order():
    png, other = encoded(picture()), encoded(picture(seed=5))
    parts = [image_url(data_url(png)), text("and"), image_url(data_url(other))]
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": parts}]})
    [message] = chat_conversation(body).messages
    assert message.content == "and"
    assert [p if isinstance(p, str) else (p.where, p.data) for p in message.parts] == [
        ("messages.0.content.0", png),
        "and",
        ("messages.0.content.2", other),
    ]
    call = {"type": "tool_use", "id": "t1", "name": "shot", "input": {}}
    blurred = [anthropic_image(png), text("blurred")]
    result = {"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": blurred}
    body = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 1,
            "messages": [
                {"role": "user", "content": [text("a"), text("b"), anthropic_image(png)]},
                {"role": "assistant", "content": [call]},
                {"role": "user", "content": [result, {"type": "text", "text": "now?"}]},
            ],
        }
    )
    user, _, tool, last = anthropic_conversation(body, seal=None).messages
    assert user.content == "a\nb" and user.parts[0] == "a\nb" and user.parts[1].where == "messages.0.content.2"
    assert tool.role == "tool" and tool.content == "Error: \nblurred"
    assert tool.parts[0] == "Error: " and tool.parts[2] == "blurred"
    assert tool.parts[1].where == "messages.2.content.0.content.0"
    assert last.content == "now?" and last.parts == []  # text alone: no parts
    items = [
        {"type": "function_call", "call_id": "c", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": [input_image(data_url(png))]},
    ]
    _, output = input_messages(items, seal=None, earlier=[])
    assert output.role == "tool" and output.content == "" and output.parts[0].where == "input.1.output.0"


def test_images_already_loaded_count_and_pass_through():
    """A Responses chain's earlier images are loaded already: counted against the limit, kept as they are."""
    earlier = ChatImage.of(picture(), "input.0.content.1")
    new = ImageSource("input.0.content.1", data=encoded(picture(seed=3)))
    loaded = asyncio.run(load([earlier, new], ImageLimits()))
    assert loaded[0] is earlier and loaded[1].digest == ChatImage.of(picture(seed=3), "x").digest
    with pytest.raises(ImageError, match="at most 1 images, this one has 2"):
        asyncio.run(load([earlier, new], ImageLimits(max_images=1)))


def test_the_digest_names_the_pixels_not_the_bytes():
    limits = ImageLimits()
    image = picture()
    png = decode(encoded(image), "a", limits)
    assert decode(encoded(image, "WEBP", lossless=True), "b", limits).digest == png.digest  # same pixels
    assert decode(encoded(image, optimize=True, compress_level=1), "c", limits).digest == png.digest
    assert decode(encoded(image, "JPEG", quality=80), "d", limits).digest != png.digest  # other pixels
    assert decode(encoded(picture(seed=1)), "e", limits).digest != png.digest
    rgba = Image.new("RGBA", (4, 4), (10, 20, 30, 0))  # transparent: over white, as processors do
    flat = decode(encoded(rgba), "f", limits)
    assert flat.image.mode == "RGB" and flat.image.getpixel((0, 0)) == (255, 255, 255)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90°
    upright = decode(encoded(picture((8, 4)), "JPEG", exif=exif), "g", limits)
    assert upright.image.size == (4, 8)


# Real published vision chat templates (tests/data/chat_templates, README.md there says where each
# comes from) and the placeholder each writes for `{"type": "image"}`.
VISION_TEMPLATES = [
    ("Qwen3.5-4B.jinja", "<|vision_start|><|image_pad|><|vision_end|>"),
    ("google-gemma-4-31B-it.jinja", "<|image|>"),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "[IMG]"),
]


@pytest.mark.parametrize("file, placeholder", VISION_TEMPLATES)
def test_vision_templates_write_a_placeholder_where_each_image_is(file, placeholder):
    one, two = (ChatImage.of(picture(seed=s), f"w{s}") for s in (1, 2))
    body = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [text("FIRST"), image_url(data_url(PNG)), text("SECOND")]},
                {"role": "assistant", "content": "ANSWER"},
                {"role": "user", "content": [image_url(data_url(PNG)), {"type": "text", "text": "THIRD"}]},
            ]
        }
    )
    conversation = chat_conversation(body)
    conversation.put_images([one, two])
    assert conversation.images() == [one, two]
    messages, tools = template_input(conversation, native=True, describe=None, history_key="reasoning_content")
    assert messages[1]["content"] == [text("FIRST"), {"type": "image"}, text("SECOND")]
    template = (DATA / file).read_text()
    rendered = render_jinja_template(
        [messages], chat_template=template, add_generation_prompt=True, bos_token="<bos>", eos_token="</s>"
    )[0][0]
    assert rendered.count(placeholder) == 2
    order = [rendered.index(s) for s in ("FIRST", placeholder, "SECOND", "ANSWER")]
    assert order == sorted(order)
    assert rendered.index(placeholder, order[1] + 1) < rendered.index("THIRD")


def test_a_tool_result_image_renders_inside_the_tool_response():
    shot, shot_block = ChatImage.of(picture(), "w"), anthropic_image(PNG)
    body = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 1,
            "messages": [
                {"role": "user", "content": "Take one."},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [shot_block]}]},
            ],
        }
    )
    conversation = anthropic_conversation(body, seal=None)
    conversation.put_images([shot])
    messages, _ = template_input(conversation, native=True, describe=None, history_key="reasoning_content")
    rendered = render_jinja_template([messages], chat_template=(DATA / "Qwen3.5-4B.jinja").read_text())[0][0]
    response = rendered[rendered.index("<tool_response>") : rendered.index("</tool_response>")]
    assert "<|vision_start|><|image_pad|><|vision_end|>" in response
    builtin, _ = template_input(Conversation(conversation.messages), native=False, describe=None, history_key="")
    assert builtin[-1]["content"] == [
        {"type": "text", "text": "<tool_response>\n"},
        {"type": "image"},
        {"type": "text", "text": "\n</tool_response>"},
    ]


class _Images(http.server.BaseHTTPRequestHandler):
    """Serves PNG at /cat.png, 2 MiB at /large, never answers /slow, and nothing else (404)."""

    stop = threading.Event()
    BODIES = {"/cat.png": PNG, "/large": b"\0" * (2 << 20)}

    def do_GET(self):
        if self.path == "/slow":
            self.stop.wait(30)
            return
        body = self.BODIES.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_urls_are_fetched_only_where_allowed_within_size_and_time():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    allowed = ImageLimits(fetch_urls=True, max_image_bytes=1 << 20, fetch_seconds=1)
    try:
        [image] = asyncio.run(load([ImageSource("input.0.content.1", url=base + "/cat.png")], allowed))
        assert image.digest == decode(PNG, "x", allowed).digest and image.where == "input.0.content.1"
        for path, limits, says in [
            ("/cat.png", ImageLimits(), "does not fetch image URLs"),
            ("/large", allowed, "at most 1048576 bytes"),
            ("/slow", allowed, "took longer than 1 s"),
            ("/missing", allowed, "answered 404"),
        ]:
            with pytest.raises(ImageError, match=says) as e:
                asyncio.run(load([ImageSource("w", url=base + path)], limits))
            assert e.value.where == "w"
    finally:
        _Images.stop.set()
        httpd.shutdown()


def test_a_stored_response_with_an_image_is_kept_in_memory_only(tmp_path):
    """No image is written to disk: a stored Responses conversation that holds one has no file."""
    shot = ChatImage.of(picture((40, 30)), "input.0.content.1")
    with_image = [with_parts("user", ["Look:", shot], ""), Message("assistant", "A gradient.")]
    store = ResponseStore(tmp_path, 1 << 30, end_kv=lambda key: None)
    store.put(StoredResponse("resp_image", "", with_image, {"id": "resp_image"}))
    store.put(StoredResponse("resp_text", "", [Message("user", "Hi")], {"id": "resp_text"}))
    store.close()
    assert [p.name for p in tmp_path.iterdir()] == [response_file(tmp_path, AgentKey("resp_text", "", "response")).name]
    assert store.get("", "resp_image").context[0].parts[1] is shot  # in memory, for a continuation
