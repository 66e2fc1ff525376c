"""Where a template writes an assistant turn's reasoning, and what it writes between the turn's
text and its calls, found by rendering a probe turn.

Templates differ in the text around reasoning (Qwen3: `<think>\\n` R `\\n</think>\\n\\n`; GLM:
`\\n<think>` R `</think>\\n`, and `\\n<think></think>\\n` for none; Qwen3.5's prompt opens
`<think>\\n` itself). The grammar makes the model write exactly that frame, so the turn it
sends back renders as it was written and the whole turn stays in the cache. A template that
drops reasoning from history (DeepSeek-R1, Gemma 4, Mistral's) has no frame: its next prompt
differs from the cached turn where the reasoning was, whatever the model writes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

REASONING, CONTENT, USER, RESULT = "PROBEREASONING", "PROBECONTENT", "PROBEUSER", "PROBERESULT"
# The probe turn calls a tool and gets its result, as an agent's turn does: templates keep the
# reasoning of such a turn (Qwen3 drops it from turns before the latest user message).
CALL = {"id": "call_probe", "type": "function", "function": {"name": "probe", "arguments": {}}}


@dataclass(frozen=True)
class ThinkFrame:
    open: str  # written before the reasoning ("" where the prompt opens it)
    close: str  # written after it, before the answer
    empty: str  # written for a turn without reasoning ("" : nothing)


def _continuation(tokenizer, message: dict) -> str | None:
    """What the template writes for `message` after the generation prompt, or None."""
    user = {"role": "user", "content": USER}
    turn = {"role": "assistant", "content": CONTENT, "tool_calls": [CALL], **message}
    result = {"role": "tool", "tool_call_id": CALL["id"], "content": RESULT}
    try:
        prompt = tokenizer.apply_chat_template([user], add_generation_prompt=True, tokenize=False)
        whole = tokenizer.apply_chat_template([user, turn, result], add_generation_prompt=False, tokenize=False)
    except Exception:  # a template that needs more than a probe (it raised): no frame
        return None
    if not whole.startswith(prompt):
        return None
    return whole[len(prompt) :]


def call_lead(tokenizer, opener: str) -> str:
    """The whitespace a template writes between a turn's text and its first call (Qwen3:
    "\\n", Qwen3.5: "\\n\\n"); "" where it writes none or the probe cannot tell."""
    turn = _continuation(tokenizer, {})
    if turn is None or CONTENT not in turn or not opener:
        return ""
    after = turn.split(CONTENT, 1)[1]
    at = after.find(opener)
    lead = after[:at] if at > 0 else ""
    return lead if not lead.strip() else ""


def think_frame(tokenizer, history_key: str) -> ThinkFrame | None:
    """The model's reasoning frame, if its template writes reasoning back."""
    thought = _continuation(tokenizer, {history_key: REASONING})
    plain = _continuation(tokenizer, {})
    if thought is None or plain is None or REASONING not in thought or CONTENT not in plain:
        return None
    open_, rest = thought.split(REASONING, 1)
    frame = ThinkFrame(open_, rest.split(CONTENT, 1)[0], plain.split(CONTENT, 1)[0])
    if any(CALL["function"]["name"] in part for part in (frame.open, frame.close, frame.empty)):
        return None  # the template writes the answer after the calls (Gemma 4): no frame to hold
    return frame
