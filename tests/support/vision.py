"""Vision models in tests: the tiny vision models (models/tiny_vision.py), pictures made with Pillow,
and a prompt with images prepared as the API does (vision/prompt.py) and given to a served
model's engine, its answer collected."""

from __future__ import annotations

import hashlib
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass

from PIL import Image

from agent_memory.agent_key import AgentKey
from agent_memory.api.serving.prompt import encode_prompt
from agent_memory.vision.prompt import VisionInputs
from agent_memory.engine.requests import Failed, Finished, GenerationRequest, SamplingParams, TextDelta
from tests.support.metrics import metric


@dataclass(frozen=True)
class Picture:
    """What `VisionPrompt.prepare` reads of an image (chat/images.py's ChatImage has these too)."""

    image: Image.Image
    digest: str


def picture(color: tuple[int, int, int], size: tuple[int, int] = (40, 30), stripe: int = 0) -> Picture:
    """A solid picture with a lighter stripe `stripe` pixels from the left; digested as its pixels."""
    image = Image.new("RGB", size, color)
    if stripe:
        image.paste((255, 255, 255), (stripe, 0, stripe + 4, size[1]))
    digest = hashlib.sha256(image.tobytes() + repr((image.size, image.mode)).encode()).hexdigest()
    return Picture(image, digest)


@dataclass
class Answer:
    text: str
    finished: Finished
    prompt: list[int]
    inputs: VisionInputs | None


def generate(
    server,
    messages: list[dict],
    images: list[Picture],
    agent: str | None = None,
    salt: str = "",
    max_tokens: int = 12,
    model: str | None = None,
) -> Answer:
    """The conversation rendered by the model's chat template (an image item: its placeholder),
    prepared with its images, and answered greedily by the served model's engine (`model`, or
    the only one served)."""
    return submit(server, messages, images, agent, salt, max_tokens, model)()


def submit(
    server,
    messages: list[dict],
    images: list[Picture],
    agent: str | None = None,
    salt: str = "",
    max_tokens: int = 12,
    model: str | None = None,
) -> Callable[[], Answer]:
    """`generate`'s request submitted now; the call returned waits for its answer (several
    submitted before any is waited for decode in one batch)."""
    models = server.app.state.server.models
    served = models[model] if model else next(iter(models.values()))
    facts = served.facts
    text = facts.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    tokens, inputs = encode_prompt(served, facts.tokenizer, text, images, "messages")
    request = GenerationRequest(
        prompt=tokens,
        params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        agent=AgentKey(agent) if agent else None,
        extra_keys=inputs.keys if inputs else (),
        vision=inputs,
        cache_salt=salt,
    )
    events: queue.Queue = queue.Queue()
    served.engine.submit(request, events.put)

    def answer() -> Answer:
        text = ""
        while True:
            event = events.get(timeout=120)
            if isinstance(event, Failed):
                raise AssertionError(event.message)
            if isinstance(event, TextDelta):
                text += event.text
            if isinstance(event, Finished):
                return Answer(text, event, tokens, inputs)

    return answer


def settle(server) -> None:
    """Wait until the engine holds no sequence: a reply can come back before the follow-up its
    turn queued (the reply's tokens as the template writes them back) is kept."""
    deadline = time.monotonic() + 60
    while any(metric(server, "agent_memory_sequences", state=s) for s in ("waiting", "prefilling", "decoding")):
        assert time.monotonic() < deadline, "the engine did not go idle"
        time.sleep(0.05)


def image_start(server, messages: list[dict]) -> int:
    """Where the first image's tokens begin in the served model's prompt of `messages` (chat
    template items: `{"type": "image"}` for each image), as the API prepares it."""
    (served,) = server.app.state.server.models.values()
    text = served.facts.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    items = [i for m in messages if isinstance(m["content"], list) for i in m["content"] if i["type"] == "image"]
    images = [picture((0, 0, 0)) for _ in items]
    return encode_prompt(served, served.facts.tokenizer, text, images, "messages")[1].spans[0].start
