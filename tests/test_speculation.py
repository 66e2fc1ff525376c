"""Speculative decoding (prompt lookup, and a draft model) through the real server: greedy
output is token for token what it is without speculation, alone and in a batch of mixed
constrained and free requests, streamed or not, where stop strings and max_tokens land inside an
accepted run; a rejected run leaves nothing in the KV a cached follow-up turn reads; a draft model
that cannot propose for the model stops the start with the reason."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.inprocess import InProcessServer, refused_start
from tests.support.metrics import metric
from tests.support.tied import ANSWER, CODE, FEW, PROMPTS, models  # noqa: F401 - models: the fixture


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]


@pytest.fixture(scope="module")
def three(models, tmp_path_factory):
    """The model served without speculation, with prompt lookup (the default) and with the draft."""
    model, draft = models
    with InProcessServer(model, tmp_path_factory.mktemp("off"), "--speculation", "off") as off:
        with InProcessServer(model, tmp_path_factory.mktemp("lookup")) as lookup:
            with InProcessServer(
                model, tmp_path_factory.mktemp("draft"), "--speculation", "draft", "--draft-model", str(draft)
            ) as d:
                yield {"off": off, "lookup": lookup, "draft": d}


class Reference:
    """The server without speculation's replies, each asked once for the module: both ways of
    proposing are compared with the same replies."""

    def __init__(self, server) -> None:
        self.client, self.replies = server.client(), {}

    def create(self, **body):
        key = json.dumps(body, sort_keys=True)
        if key not in self.replies:
            self.replies[key] = self.client.chat.completions.create(**body)
        return self.replies[key]


@pytest.fixture(scope="module")
def reference(three) -> Reference:
    return Reference(three["off"])


@pytest.fixture(params=["lookup", "draft"])
def servers(request, three, reference):
    """(the replies without speculation, the server with it), for each way of proposing."""
    return reference, three[request.param]


def request(prompt: str, max_tokens: int, **kw) -> dict:
    return dict(
        model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0, **kw
    )


def answer(response) -> tuple:
    """What a reply says: its text, its calls, why it ended."""
    choice = response.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return choice.message.content or None, calls, choice.finish_reason


def joined(chunks) -> tuple:
    """What a stream's chunks say together, as `answer` says it of a whole reply."""
    text, calls, finish = "", {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for call in delta.tool_calls or []:
            name, args = calls.get(call.index, ("", ""))
            calls[call.index] = (name + (call.function.name or ""), args + (call.function.arguments or ""))
        finish = chunk.choices[0].finish_reason or finish
    return text or None, [calls[i] for i in sorted(calls)], finish


def said(client, body: dict, stream: bool) -> tuple[tuple, object]:
    """What the reply to `body` says (`answer`), and its usage, streamed (the usage in its last
    chunk) or not."""
    if not stream:
        response = client.chat.completions.create(**body)
        return answer(response), response.usage
    chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    return joined(chunks), chunks[-1].usage


def predictions(usage) -> tuple[int, int]:
    details = usage.completion_tokens_details
    return details.accepted_prediction_tokens, details.rejected_prediction_tokens


def test_greedy_output_equals_output_without_speculation(servers):
    """Each request asked once with speculation, streamed or not in turn: every budget is asked
    both ways over the prompts."""
    off, on = servers
    plain, spec = off, on.client()
    accepted = rejected = 0
    for n, prompt in enumerate(PROMPTS):
        for m, (max_tokens, kw) in enumerate(((7, {}), (29, FEW), (80, {}), (80, FEW))):  # may cut an accepted run
            body = request(prompt, max_tokens, **kw)
            expected = plain.create(**body)
            got, usage = said(spec, body, stream=(n + m) % 2 == 1)
            assert got == answer(expected)
            assert usage.completion_tokens == expected.usage.completion_tokens
            accepted, rejected = accepted + predictions(usage)[0], rejected + predictions(usage)[1]
            assert predictions(expected.usage) == (0, 0)
    assert accepted > 0 and rejected > 0  # speculation ran: runs were verified, some refused
    assert metric(on, "agent_memory_speculation_accepted_tokens_total") >= accepted
    assert metric(on, "agent_memory_speculation_proposed_tokens_total") >= accepted


def test_stop_strings_inside_accepted_runs(servers):
    off, on = servers
    plain, spec = off, on.client()
    for n, prompt in enumerate(PROMPTS[:2]):
        text = plain.create(**request(prompt, 80, **FEW)).choices[0].message.content
        for m, at in enumerate((5, len(text) // 2, len(text) - 6)):  # each both ways over the prompts
            body = request(prompt, 80, stop=[text[at : at + 4]], **FEW)
            assert said(spec, body, stream=(n + m) % 2 == 1)[0] == answer(plain.create(**body))


def test_batch_of_eight_mixed_equals_solo_without_speculation(servers):
    """Free and constrained (JSON schema, a required tool call) requests of different lengths,
    streamed and not, together in one batch, against each alone without speculation."""
    off, on = servers
    plain = off
    text = plain.create(**request(PROMPTS[0], 60, **FEW)).choices[0].message.content
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    bodies = [
        request(PROMPTS[0], 60),
        request(PROMPTS[0], 60, stop=[text[20:24]], **FEW),
        request(PROMPTS[1], 45, **FEW),
        request(PROMPTS[2], 13),
        request(PROMPTS[1], 50, response_format=schema),
        request(f"Reply in JSON. {CODE}", 40, response_format={"type": "json_object"}),
        request(f"Read handler_3's file. {CODE}", 40, tools=TOOLS, tool_choice="required"),
        request(PROMPTS[3], 70, tools=TOOLS, tool_choice="auto"),
    ]
    expected = [answer(plain.create(**b)) for b in bodies]

    async def together():
        client = on.async_client()

        async def one(i, body):
            if i % 2 == 0:
                return answer(await client.chat.completions.create(**body))
            return joined([chunk async for chunk in await client.chat.completions.create(**body, stream=True)])

        return await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))

    before = metric(on, "agent_memory_speculation_accepted_tokens_total")
    assert asyncio.run(together()) == expected
    assert metric(on, "agent_memory_speculation_accepted_tokens_total") > before
    json.loads(expected[4][0])  # the constrained ones are what their grammar allows
    assert expected[6][1] and expected[6][2] == "tool_calls"


def test_cached_follow_up_turn_answers_exactly(servers):
    """A turn's rejected proposals never reach the KV its agent keeps: the next turn, read from
    the cache, answers as the uncached model does."""
    off, on = servers
    plain, spec = off, on.client()
    rejected = 0
    for n, prompt in enumerate(PROMPTS):
        agent = {"prompt_cache_key": f"editor-{n}"}
        first = spec.chat.completions.create(**request(prompt, 80, **FEW), extra_body=agent)
        rejected += predictions(first.usage)[1]
        messages = [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "Now the same again, with handler_2 removed."},
        ]
        body = dict(model="tiny", messages=messages, max_tokens=60, temperature=0, **FEW)
        second = spec.chat.completions.create(**body, extra_body=agent)
        assert second.usage.prompt_tokens_details.model_extra["hot_tokens"] > first.usage.prompt_tokens
        assert answer(second) == answer(plain.create(**body))
    assert rejected > 0


def test_seeded_sampling_equals_sampling_without_speculation(servers):
    """A sampled position is accepted where the request's own sample there, with the key it has
    without speculation, is the proposed token: a seed gives the output it gives without
    speculation, whichever requests share the batch."""
    off, on = servers
    spec = on.client()
    accepted = 0
    for prompt in PROMPTS[:2]:
        for kw in ({}, FEW):
            body = request(prompt, 60, seed=11, **kw) | {"temperature": 0.7, "top_p": 0.9}
            expected = answer(off.create(**body))
            alone = spec.chat.completions.create(**body)
            accepted += predictions(alone.usage)[0]
            assert answer(alone) == expected

            async def with_others():
                client = on.async_client()
                others = [client.chat.completions.create(**request(p, 40)) for p in PROMPTS]
                return await asyncio.gather(client.chat.completions.create(**body), *others)

            assert answer(asyncio.run(with_others())[0]) == expected
    assert accepted > 0


@pytest.mark.parametrize("parallel", [False, True])
def test_a_refused_run_past_a_calls_end_rolls_the_grammar_back_exactly(tiny_model, parallel):
    """Proposals that run through a call's end (`</tool_call>`, then the end token), refused part
    way: the grammar goes back to the last accepted one exactly and takes the rest of the call
    again. The grammar processor the batch runs, driven as speculative_batch.py drives it (a
    state saved after each verified position, the accepted one's restored). One call only: the
    call's end stops the matcher, which then takes the end token without recording it; parallel
    calls: the end token is what stops it, and is recorded."""
    import agent_memory.blas  # noqa: F401
    import mlx.core as mx
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from agent_memory.chat.conversation import Conversation, Message, Tool, ToolChoice
    from agent_memory.chat.grammar import GrammarCompiler
    from agent_memory.engine.tokens.constraint import GrammarProcessor

    tokenizer = load_tokenizer(tiny_model)
    compiler = GrammarCompiler(tokenizer, 2048)
    tools = [Tool("read_file", "", TOOLS[0]["function"]["parameters"])]
    conversation = Conversation([Message("user", "hi")], tools, ToolChoice("required"), parallel_tool_calls=parallel)
    grammar = compiler.grammar(conversation, "tools", "response_format")
    text = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a/b.py"}}\n</tool_call>'
    call, end = tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id
    processor = GrammarProcessor(compiler.output(grammar, True), 2048, sorted(tokenizer.eos_token_ids), 200)
    logits = mx.zeros((1, 2048))
    processor(mx.array([0]), logits)  # the first step: the prompt's last token, nothing to consume
    proposed = call[1:] + [end]
    assert processor.allows(call[0], proposed) == len(proposed)  # the end token is proposed too
    saved = []
    for token in [call[0], *proposed]:  # the verify step: the sampled token, then the proposals
        processor(mx.array([token]), logits)
        saved.append(processor.save())
    accepted = len(call) - 5  # refused inside the arguments' closing
    processor.restore(saved[accepted])
    assert processor.matcher.validate_tokens(call[accepted + 1 :]) == len(call) - accepted - 1
    for token in call[accepted + 1 :]:  # the following steps write the rest of the call again
        masked = processor(mx.array([token]), logits)
    assert processor.error is None
    assert masked[0, end].item() == 0 and processor.matcher.is_accepting()


def test_a_draft_that_cannot_propose_for_the_model_stops_the_start(models, tmp_path):
    """Refused at start with the reason: no draft named, one named for lookup, one whose
    vocabulary is another, one whose window layers cannot drop rejected drafts."""
    from agent_memory.models.tiny import build_tiny
    from tests.support.templates import chat_template

    model, draft = models
    other = build_tiny(tmp_path / "other", template=chat_template("qwen3"))
    window = build_tiny(tmp_path / "window", arch="gemma3_text")
    cases = [
        (["--speculation", "draft"], "--speculation draft needs --draft-model"),
        (["--draft-model", str(draft)], "--draft-model is read only with --speculation draft"),
        (["--speculation", "draft", "--draft-model", str(other)], "its tokenizer's vocabulary is not tied's"),
        (["--speculation", "draft", "--draft-model", str(window)], "RotatingKVCache; a draft model must keep"),
    ]
    for args, said in cases:  # checked in process (tests/support/inprocess.py refused_start)
        why = refused_start(model, tmp_path / "cache", *args)
        assert said in why and "Traceback" not in why, why
