"""What a chat turn leaves for the next one: the history as the chat template will write it back.

A model's reply and the same reply rendered back by its template often differ: the template
drops or moves the reasoning, joins content and calls with its own separator, writes arguments
again with `tojson`, numbers calls or writes their ids (Kimi, Mistral), closes a call with its
own marker (harmony's `<|call|>`). Encoding the reply's text after the prompt predicts none of
that; the template itself does. `settled_history` renders the conversation, the reply as its
client sends it back, and a probe after it (a result per call, else a user message) whose content
is a marker, and cuts the text where the marker begins: every character the next request shares
with this one, up to the next message's own content (docs/usage.md, "Tools").
"""

from __future__ import annotations

from dataclasses import replace

from agent_memory.chat.conversation import Conversation, Message
from agent_memory.chat.render import template_input

# The probe's content, found with str.find: ASCII letters and digits only, so that a template
# writing a result with `tojson` (which escapes other characters) writes it as it is.
PROBE = "AMPROBE7f3c9e1d"


def probes(reply: Message) -> list[Message]:
    """What follows the reply in the next request: a result for each of its calls (answering
    the ids the client got), else the user's next message."""
    return [Message("tool", PROBE, tool_call_id=c.id) for c in reply.tool_calls] or [Message("user", PROBE)]


def settled_history(tokenizer, conversation: Conversation, reply: Message, fmt) -> str | None:
    """The text the next request's prompt begins with: `conversation` and `reply` rendered by
    the chat template as the next request renders them (the reply format `fmt`'s tools and
    reasoning, the request's template variables), up to the probe's content. None where the
    template writes no probe (it drops the message) or refuses the turn."""
    settled = replace(conversation, messages=[*conversation.messages, reply, *probes(reply)])
    rendered, tools = template_input(settled, fmt.native, fmt.describe, fmt.history_key)
    try:
        text = tokenizer.apply_chat_template(
            rendered, tools=tools, add_generation_prompt=False, tokenize=False, **conversation.thinking.kwargs()
        )
    except Exception:  # the template refuses what the client will not send back either
        return None
    at = text.find(PROBE)
    return text[:at] if at > 0 else None


def settled_tokens(tokenizer, text: str) -> list[int]:
    """The settled history's tokens, less the last: it may merge with what follows it."""
    return tokenizer.encode(text, add_special_tokens=False)[:-1]
