"""Anthropic Messages bodies as a Conversation and an agent (messages.py serves them). Two
things are particular to Claude Code (docs/usage.md, "Anthropic Messages"):

- What changes on every request is left out of the prompt, so it does not cost the agent its
  cache: the `x-anthropic-billing-header: …` line Claude Code puts first in `system` (its `cch`
  changes per request before v2.1.181, its `cc_version` per conversation after), and
  `<total_tokens>…</total_tokens>` markers in system content (a countdown in some builds).
- Its `metadata.user_id` (JSON with a `session_id`, or `user_…_session_<uuid>` before) names an
  agent per session *and system prompt* (and subagent, by `x-claude-code-agent-id`): the
  title and other background requests it interleaves with the main loop, with system prompts of
  their own, are then agents of their own and do not move the main agent off its conversation.
"""

from __future__ import annotations

import hashlib
import json
import re

from fastapi import Request

from agent_memory.agent_key import AgentKey
from agent_memory.api.agent_ids import check_agent_id
from agent_memory.api.anthropic.schemas import (
    ImageBlock,
    MessageParam,
    MessagesRequest,
    PromptFields,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    joined,
)
from agent_memory.api.errors import APIError
from agent_memory.api.sealing import TenantSeal
from agent_memory.api.serving.prompt import Prepared, prepare_chat
from agent_memory.api.serving.speaker import agent_key, utf8_header
from agent_memory.api.state import ServedModel
from agent_memory.chat.conversation import (
    Conversation,
    Message,
    OutputFormat,
    Thinking,
    Tool,
    ToolCall,
    ToolChoice,
    with_parts,
)

BILLING_PREFIX = "x-anthropic-billing-header:"
TOTAL_TOKENS = re.compile(r"<total_tokens>[^<]*</total_tokens>")
SESSION_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
LEGACY_USER_ID = re.compile(r"^user_[0-9a-f]*_account_[0-9a-f-]*_session_([0-9a-f-]{1,64})$")


def system_text(blocks: list[TextBlock] | None) -> str:
    """The system prompt, blocks joined by a line break, less Claude Code's billing line (a
    block, or the first line of one, starting `x-anthropic-billing-header:`) and any
    `<total_tokens>` marker; a block left blank goes."""
    parts = []
    for block in blocks or []:
        text = block.text
        if text.startswith(BILLING_PREFIX):
            text = text.partition("\n")[2]
        text = TOTAL_TOKENS.sub("", text)
        if text.strip():
            parts.append(text)
    return "\n".join(parts)


def _messages(i: int, m: MessageParam, seal: TenantSeal) -> list[Message]:
    """One Anthropic message as conversation messages: tool results are messages of their own
    (role "tool"), in place among the user's text and images; thinking blocks are the turn's
    reasoning (their signatures opened by `seal`)."""
    for j, block in enumerate(m.content):
        wrong = (m.role == "user" and isinstance(block, ToolUseBlock)) or (
            m.role != "user" and isinstance(block, (ToolResultBlock, ImageBlock))
        )
        if wrong:
            raise APIError(400, f"a {block.type} block cannot be in a {m.role} message", param=f"messages.{i}.content.{j}")
    if m.role == "system":  # in place, never hoisted: moving it would change the prompt's prefix
        text = TOTAL_TOKENS.sub("", joined(m.content))
        return [Message("system", text)] if text.strip() else []
    out: list[Message] = []
    texts: list = []  # text, and images' sources
    calls: list[ToolCall] = []
    reasoning: list[str] = []
    for j, block in enumerate(m.content):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ImageBlock):
            texts.append(block.image_source(f"messages.{i}.content.{j}"))
        elif isinstance(block, ThinkingBlock):
            reasoning.append(block.reasoning(seal, f"messages.{i}.content.{j}"))
        elif isinstance(block, ToolUseBlock):
            # As the model wrote it (json.dumps' separators, keys in order): the prompt extends
            # the cached turn token for token.
            calls.append(ToolCall(block.id, block.name, json.dumps(block.input, ensure_ascii=False)))
        elif isinstance(block, ToolResultBlock):
            if texts:
                out.append(with_parts("user", texts, "\n"))
                texts = []
            out.append(_result(block, f"messages.{i}.content.{j}"))
    if texts or calls or not out:
        reasoned = "".join(reasoning) if m.role == "assistant" else ""
        out.append(with_parts(m.role, texts or [""], "\n", tool_calls=calls, reasoning=reasoned))
    return out


def _result(block: ToolResultBlock, where: str) -> Message:
    """A tool_result as a tool message: its text blocks joined by a line break, its images in
    place (Claude Code's screenshots), "Error: " first where it is one."""
    parts = [
        b.text if isinstance(b, TextBlock) else b.image_source(f"{where}.content.{k}")
        for k, b in enumerate(block.content)
    ]
    if block.is_error:
        parts = ["Error: " + parts[0], *parts[1:]] if parts and isinstance(parts[0], str) else ["Error: ", *parts]
    return with_parts("tool", parts or [""], "\n", tool_call_id=block.tool_use_id)


def conversation(body: PromptFields, seal: TenantSeal) -> Conversation:
    last = next((m for m in reversed(body.messages) if m.role != "system"), None)
    if last is not None and last.role == "assistant":
        raise APIError(
            400,
            "the last message is the assistant's: continuing it (prefill) is not supported; end with a user message",
            param=f"messages.{body.messages.index(last)}",
        )
    return as_conversation(body, seal)


def as_conversation(body: PromptFields, seal: TenantSeal) -> Conversation:
    """The body as a Conversation, whichever message is last (a breakpoint's part of it too)."""
    system = system_text(body.system)
    messages = [Message("system", system)] if system else []
    for i, m in enumerate(body.messages):
        messages.extend(_messages(i, m, seal))
    tools = [Tool(t.name, t.description, t.input_schema) for t in body.tools or []]
    choice = body.tool_choice
    if not tools or (choice is not None and choice.type == "none"):
        mode = ToolChoice("none")
    elif choice is None or choice.type == "auto":
        mode = ToolChoice("auto")
    elif choice.type == "any":
        mode = ToolChoice("required")
    else:
        mode = ToolChoice("named", choice.name)
    parallel = not (choice is not None and choice.disable_parallel_tool_use)
    fmt = body.output_config.format if body.output_config is not None else None
    output = OutputFormat("json_schema", fmt.schema_) if fmt is not None else OutputFormat()
    thinking = Thinking() if body.thinking is None else Thinking(enabled=body.thinking.type != "disabled")
    return Conversation(messages, tools, mode, parallel, output, thinking)


async def prepare(model: ServedModel, conv: Conversation, constrained: bool = True) -> Prepared:
    """prepare_chat, with a tool's schema named as this wire format names it."""
    try:
        return await prepare_chat(model, conv, ("messages", "tools", "output_config.format"), constrained)
    except APIError as e:
        if e.param and e.param.endswith(".parameters"):  # tools.N.parameters: our tools.N.input_schema
            ours = e.param.removesuffix(".parameters") + ".input_schema"
            raise APIError(e.status, e.message.replace(e.param, ours), param=ours, code=e.code) from e
        raise


def claude_code_session(user_id: str) -> str | None:
    """The session id in Claude Code's metadata.user_id: JSON with a `session_id` (v2.1.x), or
    `user_<hex>_account_<uuid>_session_<uuid>` (earlier); None for any other user id."""
    if user_id.startswith("{"):
        try:
            data = json.loads(user_id)
        except ValueError:
            return None
        session = data.get("session_id") if isinstance(data, dict) else None
        return session if isinstance(session, str) and SESSION_ID.match(session) else None
    match = LEGACY_USER_ID.match(user_id)
    return match.group(1) if match else None


def agent(body: MessagesRequest, request: Request) -> AgentKey | None:
    """metadata.user_id, else X-Agent-Id, else None (anonymous: the prefix match alone). A
    Claude Code user id names `claude-code:<session>[:<subagent>]:<system prompt hash>`."""
    user_id = body.metadata.user_id if body.metadata is not None else None
    session = claude_code_session(user_id) if user_id else None
    if session is not None:
        parts = ["claude-code", session]
        if subagent := utf8_header(request, "x-claude-code-agent-id"):
            check_agent_id(subagent, "x-claude-code-agent-id")
            parts.append(subagent[:64])
        parts.append(hashlib.blake2b(system_text(body.system).encode(), digest_size=4).hexdigest())
        user_id = ":".join(parts)
    return agent_key(request, [("metadata.user_id", user_id), ("X-Agent-Id", utf8_header(request, "X-Agent-Id"))])
