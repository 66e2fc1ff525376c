"""A tiny model whose weights are set by hand so that an agent program's turn goes somewhere:
it answers its first prompt with a call to one named tool (the server's constrained decoding
writes the call's syntax and arguments; the model only prefers the tool's name and short
values), and once a tool's result is in the conversation it answers with a fixed text and ends
its turn. Random weights cannot do this: under `tool_choice: auto` a random model writes text
until its token limit, and a program such as Codex never sends the second request of a task.

How the weights do it (a llama with the Qwen3 chat template, so `<tool_response>` is one token):
every token's embedding is a constant unit (a bias carrier) plus one unit naming its role (the
generation prompt's last `\\n`, each answer token, `<tool_response>`, or "other"). Layer 0 has
one attention head whose query is constant and whose key is large only at `<tool_response>`, so
it attends there when the token is in context and writes a "tool result seen" unit into the
residual stream; every other projection is zero. The output head then reads a bigram table
(after the prompt's `\\n`: the call opener, or the first answer token once a result is seen;
each answer token: the next, the last: end of turn) plus a per-token bias that prefers the
tool's name and the JSON closers, which is what greedy decoding inside the grammar picks from.
RoPE's base is raised so the attending pair of dimensions does not rotate over 32k positions.

A reply of two lines: the cue to start answering is the newline ending the prompt, so the model
cannot write that token inside its answer. Its tokenizer holds one more token, `.\n` (a sentence's
end and a line break, as real BPE tokenizers such as Qwen's write them), which no prompt ends in.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file
from tokenizers import AddedToken, Tokenizer

from agent_memory.models.tiny import build_tiny
from tests.support.templates import chat_template

CONTEXT = 65536  # Claude Code's prompt is 19-32k tokens of this tokenizer, plus its max_tokens
BIAS, SEEN, PROMPT_END, OTHER, OPENS = 0, 1, 2, 3, 4  # embedding dimensions; answer tokens use 5, 6, ...
ANSWER_DIM = 5
RESULT_SEEN = 1.0  # the residual stream's "tool result seen" unit after layer 0
LINE_END = ".\n"  # the added token an answer ends a line with (not a cue: a prompt never ends in it)
# One layer, narrow: the programs' prompts are 15-32k tokens, and this keeps their prefill short.
SMALL = {
    "num_hidden_layers": 1,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
}
ATTEND = 2.5  # query and key size on the attending pair: a score far above log(context) at <tool_response>
# Where the grammar allows a closer, take it: '"' before more of a string, "}" after a value;
# both above every other piece of the call (1 per character). Right after "{", "}" (a bigram).
CLOSERS = {'"': 14.0, "}": 12.0}
EMPTY_OBJECT = 20.0


def scripted_model(
    root: Path, *, tool: str | None, answer: str | tuple[str, ...] = "Done.", context: int = CONTEXT
) -> Path:
    """A model folder under `root`: with `tool`, its first turn calls `tool`; with None, it answers
    `answer` at once. After a tool result it always answers `answer`. `context`: its window.
    `answer` as pieces: it writes each as the tokenizer writes it alone, so the text, tokenized
    whole, comes back as other tokens (what a follow-up makes canonical: engine/sequence.py)."""
    pieces = (answer,) if isinstance(answer, str) else answer
    name = f"scripted-{tool or 'answer'}" + ("" if context == CONTEXT else f"-{context}")
    if pieces != ("Done.",):
        name += "-" + hashlib.blake2b("\0".join(pieces).encode(), digest_size=4).hexdigest()
    out = root / name
    if (out / "model.safetensors").exists():
        return out
    base = build_tiny(
        root / f".{name}-base",
        arch="llama",
        template=chat_template("qwen3"),
        config={"max_position_embeddings": context, "rope_theta": 1e12, **SMALL},
    )
    work = root / f".{name}-work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    tokenizer = Tokenizer.from_file(str(work / "tokenizer.json"))
    tokenizer.add_tokens([AddedToken(LINE_END, normalized=False)])
    tokenizer.save(str(work / "tokenizer.json"))
    config = {**json.loads((work / "config.json").read_text()), "vocab_size": tokenizer.get_vocab_size()}
    (work / "config.json").write_text(json.dumps(config, indent=1))
    weights = load_file(str(work / "model.safetensors"))
    save_file(_weights(weights, config, tokenizer, tool, pieces), str(work / "model.safetensors"))
    work.rename(out)
    return out


def _id(tokenizer: Tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert len(ids) == 1, (text, ids)
    return ids[0]


def _weights(weights: dict, config: dict, tokenizer: Tokenizer, tool: str | None, pieces: tuple[str, ...]) -> dict:
    hidden, vocab, head = config["hidden_size"], config["vocab_size"], config["head_dim"]
    dtype = weights["model.embed_tokens.weight"].dtype
    out = {key: np.zeros_like(value) for key, value in weights.items()}
    for key in ("model.embed_tokens.weight", "lm_head.weight"):  # one row more: LINE_END's
        out[key] = np.zeros((vocab, hidden), dtype)
    for key in out:
        if key.endswith("norm.weight"):
            out[key][:] = 1.0
    answer_ids = [i for piece in pieces for i in tokenizer.encode(piece, add_special_tokens=False).ids]
    assert len(set(answer_ids)) == len(answer_ids) and ANSWER_DIM + len(answer_ids) <= hidden, answer_ids
    result, opener = _id(tokenizer, "<tool_response>"), _id(tokenizer, "<tool_call>")
    end = _id(tokenizer, "<|im_end|>")

    embed = out["model.embed_tokens.weight"]
    embed[:, BIAS] = 1.0
    embed[:, OTHER] = 1.0  # a generation prompt ends in a newline token (Qwen3's: "\n", or "\n\n" after an empty think)
    newlines = [t for t in range(vocab) if set(tokenizer.decode([t], skip_special_tokens=False)) == {"\n"}]
    opens = [t for t in range(vocab) if tokenizer.decode([t], skip_special_tokens=False).endswith("{")]
    roles = [(t, PROMPT_END) for t in newlines] + [(t, OPENS) for t in opens] + [(result, SEEN)]
    roles += [(t, ANSWER_DIM + i) for i, t in enumerate(answer_ids)]
    for token, dim in roles:
        embed[token, OTHER] = 0.0
        embed[token, dim] = 1.0
    unit = np.sqrt(hidden / 2)  # each of a token's two unit entries after RMSNorm

    # Layer 0, head 0: a constant query, a key only at <tool_response> (on the last pair of
    # dimensions, which RoPE turns slowest), its value a unit copied to the SEEN dimension.
    layer = "model.layers.0.self_attn."
    out[layer + "q_proj.weight"][head - 1, BIAS] = ATTEND
    out[layer + "k_proj.weight"][head - 1, SEEN] = ATTEND
    out[layer + "v_proj.weight"][0, SEEN] = 1.0
    out[layer + "o_proj.weight"][SEEN, 0] = RESULT_SEEN / unit

    lm = out["lm_head.weight"]
    # Logits are these times ~5 (a unit after RMSNorm): every choice wins by tens of nats, so
    # sampling at any temperature a program asks for picks what greedy decoding would.
    if tool is not None:
        lm[opener, PROMPT_END] = 30.0
        lm[opener, SEEN] = -30.0
    lm[answer_ids[0], PROMPT_END] = 15.0
    lm[answer_ids[0], SEEN] = 30.0
    for i, token in enumerate(answer_ids):
        lm[answer_ids[i + 1] if i + 1 < len(answer_ids) else end, ANSWER_DIM + i] = (
            50.0  # over the SEEN pull and any bias
        )
    for token, bias in _preferred(tokenizer, vocab, tool).items():
        lm[token, BIAS] = bias
    lm[end, BIAS] = 3.0  # after the call: end the turn
    lm[_id(tokenizer, "}"), OPENS] = EMPTY_OBJECT  # an object with nothing required stays empty
    return {key: value.astype(dtype) for key, value in out.items()}


def _preferred(tokenizer: Tokenizer, vocab: int, tool: str | None) -> dict[int, float]:
    """Per-token bias (read on the constant unit, so in every context): inside a call the grammar
    allows many tokens and greedy decoding takes the highest: the tool's name, JSON's closers and
    the end of the call, longest first, closers before all; whitespace last."""
    wanted = f'{{"name": "{tool}", "arguments": {{}}}}</tool_call>' if tool else ""
    bias = {}
    for token in range(vocab):
        piece = tokenizer.decode([token], skip_special_tokens=False)
        if piece and wanted and piece in wanted:
            bias[token] = CLOSERS.get(piece, float(len(piece)))
        elif piece.strip() == "" and piece:
            bias[token] = -1.0
    return bias
