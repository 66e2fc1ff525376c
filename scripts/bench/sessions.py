"""Each coding agent's session shape for scripts/bench_sessions.py: the API it speaks, how big
its head (system prompt + tools) is, how it names itself when it does, and how it builds its
next request from the server's actual previous reply (assistant content and tool calls exactly
as the API returned them, then the tools' results or a new user message).

Heads are synthetic: slices of this repository's docs sized with the model's own tokenizer, the
same for every session of a shape (unless given a `head_key` of its own), as a client's head
is; each session's own tag starts its first user message, so sessions share their head and
nothing after it."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from bench.server import REPO

TOOL_NAMES = ("read_file", "write_file", "run_command", "search_code", "list_dir", "fetch_url")
QUESTIONS = ("Find where the cache folder is chosen and explain how to change it.",
             "Now check whether the tests cover that path and say which ones do.",
             "Summarize what you found, with the files involved.",
             "What would you change first, and why?")


class Text:
    """Deterministic filler: the repo's docs as one text, any n tokens of it from a position."""

    def __init__(self, tokenizer) -> None:
        self.text = "\n\n".join((REPO / "docs" / n).read_text() for n in ("usage.md", "architecture.md"))
        self.offsets = tokenizer.encode(self.text, add_special_tokens=False).offsets

    def piece(self, pos: int, n: int) -> tuple[str, int]:
        """The text of n tokens from token `pos`, going on from the start past the end (so two
        pieces from different positions differ), and the position after it."""
        if n <= 0:
            return "", pos
        pos %= len(self.offsets)
        end = min(pos + n, len(self.offsets))
        text = self.text[self.offsets[pos][0]: self.offsets[end - 1][1]]
        if end - pos < n:
            rest, end = self.piece(0, n - (end - pos))
            text += "\n" + rest
        return text, end


@dataclass
class Shape:
    """One agent's session: its wire format, head size (tokens, tools included), how it is named
    when named (`by`: a body field or the X-Agent-Id header), and its layout's quirks."""

    name: str
    wire: str  # "chat", "responses" or "messages"
    head: int
    tools: bool = True
    by: str = "prompt_cache_key"
    side_head: int = 0  # Qwen Code: a second request of another head each turn
    files: int = 0  # aider: files sent after the history, at the end of every request
    note: str = ""


SHAPES = {s.name: s for s in (
    Shape("claude-code", "messages", 19_000, by="metadata.user_id",
          note="Anthropic Messages, tool_use -> tool_result"),
    Shape("codex", "responses", 15_000, note="Responses, store false, function_call -> function_call_output"),
    Shape("opencode", "chat", 11_600, note="chat completions with tools (setCacheKey: prompt_cache_key)"),
    Shape("qwen-code", "chat", 17_500, by="X-Agent-Id", side_head=17_000,
          note="chat with tools; a second request of another head each turn (named: an id of its own)"),
    Shape("aider", "chat", 700, tools=False, by="X-Agent-Id", files=300,
          note="chat, the files after the history"),
    Shape("llm", "chat", 0, tools=False, by="X-Agent-Id", note="`llm -c`: short chat, no system, no tools"),
)}


def tool_specs(descriptions: list[str]) -> list[dict]:
    """Six tools with these descriptions: (name, description, JSON schema)."""
    schema = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 40},
                                               "reason": {"type": "string", "maxLength": 120}},
              "required": ["path", "reason"], "additionalProperties": False}
    return [{"name": n, "description": d, "schema": schema} for n, d in zip(TOOL_NAMES, descriptions)]


@dataclass
class Session:
    """One session of one shape: its head, its history in its API's own items, its turns."""

    shape: Shape
    tag: str
    agent: str | None  # None: unnamed
    text: Text
    max_tokens: int = 96
    history: list = field(default_factory=list)
    head_key: str = ""  # sessions with the same key get the same head (default: the shape's name)
    scale: float = 1.0  # of the shape's head sizes (a smoke test's small model)
    pending_calls: list = field(default_factory=list)
    pos: int = 0  # where the next piece of filler starts

    def __post_init__(self) -> None:
        s = self.shape
        self.pos = zlib.crc32((self.head_key or s.name).encode()) % len(self.text.offsets)
        head = int(s.head * self.scale)
        tools_share = int(head * 0.35) if s.tools else 0
        self.tools = tool_specs([self._take(tools_share // len(TOOL_NAMES)) for _ in TOOL_NAMES]) if s.tools else []
        self.system = f"[{self.head_key or s.name}]\n" + self._take(head - tools_share) if head else ""
        self.side_system = self._take(int(s.side_head * self.scale))
        self.files = self._take(int(s.files * self.scale))
        self.pos = zlib.crc32(self.tag.encode()) % len(self.text.offsets)  # the session's own results

    def _take(self, n: int) -> str:
        piece, self.pos = self.text.piece(self.pos, n)
        return piece

    # -- what a request carries -------------------------------------------------------------

    def _named(self, body: dict, headers: dict, side: bool) -> None:
        """The agent id where the shape sends one; Qwen Code's second request under an id of its
        own (one id on both makes them one agent whose each request replaces the other's memory)."""
        if self.agent is None:
            return
        agent = self.agent + "-2nd" if side else self.agent
        if self.shape.by == "X-Agent-Id":
            headers["X-Agent-Id"] = agent
        elif self.shape.by == "metadata.user_id":
            body["metadata"] = {"user_id": agent}
        else:
            body[self.shape.by] = agent

    def request(self, turn: int, side: bool = False) -> tuple[str, dict, dict]:
        """(path, body, headers) of this turn's request: a tool call forced on turns 1-2 (a
        random-weight model calls no tool by itself; the clients send `auto`), `auto` after."""
        forced = turn <= 2 and self.tools and not side
        body: dict = {"model": "local", "temperature": 0}
        headers: dict = {}
        self._named(body, headers, side)
        wire = self.shape.wire
        items = list(self.history)
        if side:  # Qwen Code's second request: another head, the conversation, one question
            items = items + self._user("Who should speak next, the user or the model? Answer in JSON.")
        elif self.files:  # aider: the files after the history, before the current message
            items = items[:-1] + self._user("I added these files:\n" + self.files) + \
                [{"role": "assistant", "content": "Ok, I will treat them as the truth."}] + items[-1:]
        system = self.side_system if side else self.system
        if wire == "messages":
            body.update(max_tokens=self.max_tokens, messages=items, system=[{"type": "text", "text": system}])
            if self.tools and not side:
                body["tools"] = [{"name": t["name"], "description": t["description"], "input_schema": t["schema"]}
                                 for t in self.tools]
                body["tool_choice"] = {"type": "any" if forced else "auto"}
            return "/v1/messages", body, headers
        if wire == "responses":
            body.update(max_output_tokens=self.max_tokens, input=items, instructions=system, store=False)
            if self.tools:
                body["tools"] = [{"type": "function", "name": t["name"], "description": t["description"],
                                  "parameters": t["schema"], "strict": False} for t in self.tools]
                body["tool_choice"] = "required" if forced else "auto"
            return "/v1/responses", body, headers
        body.update(max_tokens=self.max_tokens,
                    messages=([{"role": "system", "content": system}] if system else []) + items)
        if self.tools and not side:
            body["tools"] = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                               "parameters": t["schema"]}} for t in self.tools]
            body["tool_choice"] = "required" if forced else "auto"
        return "/v1/chat/completions", body, headers

    # -- how the history grows ---------------------------------------------------------------

    def _user(self, text: str) -> list:
        wire = self.shape.wire
        if wire == "messages":
            return [{"role": "user", "content": [{"type": "text", "text": text}]}]
        if wire == "responses":
            return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}]
        return [{"role": "user", "content": text}]

    def ask(self, turn: int) -> None:
        """Before turn `turn`: the tools' results for the previous reply's calls, or a new question."""
        if self.pending_calls:
            self.history += self._results(self.pending_calls, turn)
            self.pending_calls = []
        else:
            tag = f"[session {self.tag}] " if not self.history else ""
            self.history += self._user(tag + QUESTIONS[(turn - 1) % len(QUESTIONS)])

    def _results(self, calls: list[str], turn: int) -> list:
        out = [f"result {turn}.{i}:\n" + self._take(150) for i, _ in enumerate(calls)]
        wire = self.shape.wire
        if wire == "messages":
            return [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": c, "content": o}
                                                 for c, o in zip(calls, out)]}]
        if wire == "responses":
            return [{"type": "function_call_output", "call_id": c, "output": o} for c, o in zip(calls, out)]
        return [{"role": "tool", "tool_call_id": c, "content": o} for c, o in zip(calls, out)]

    def answered(self, reply: dict) -> None:
        """The reply as the client keeps it: its content and calls exactly as returned."""
        wire = self.shape.wire
        if wire == "messages":
            self.history.append({"role": "assistant", "content": reply["content"]})
            self.pending_calls = [b["id"] for b in reply["content"] if b["type"] == "tool_use"]
        elif wire == "responses":
            for item in reply["output"]:
                if item["type"] == "function_call":
                    self.history.append({k: item[k] for k in ("type", "call_id", "name", "arguments")})
                    self.pending_calls.append(item["call_id"])
                elif item["type"] == "message":
                    self.history.append({"type": "message", "role": "assistant", "content": [
                        {"type": "output_text", "text": p["text"]} for p in item["content"]]})
        else:
            msg = reply["choices"][0]["message"]
            kept = {"role": "assistant", "content": msg.get("content")}
            if msg.get("tool_calls"):
                kept["tool_calls"] = msg["tool_calls"]
                self.pending_calls = [c["id"] for c in msg["tool_calls"]]
            self.history.append(kept)


def usage_of(wire: str, reply: dict) -> dict:
    """prompt, completion, cached, hot, warm tokens and the miss (reason@at+lost) of any API."""
    u = reply.get("usage") or {}
    if wire == "messages":
        read = u.get("cache_read_input_tokens", 0)
        prompt, completion = u.get("input_tokens", 0) + u.get("cache_creation_input_tokens", 0) + read, \
            u.get("output_tokens")
        hot, warm, miss = u.get("cache_read_hot_input_tokens"), u.get("cache_read_warm_input_tokens"), \
            u.get("cache_miss")
    else:
        d = u.get("input_tokens_details" if wire == "responses" else "prompt_tokens_details") or {}
        prompt = u.get("input_tokens" if wire == "responses" else "prompt_tokens")
        completion = u.get("output_tokens" if wire == "responses" else "completion_tokens")
        read, hot, warm, miss = d.get("cached_tokens"), d.get("hot_tokens"), d.get("warm_tokens"), d.get("cache_miss")
    return {"prompt": prompt, "completion": completion, "cached": read, "hot": hot, "warm": warm,
            "miss": (f"{miss['reason']}@{miss['at']}" + (f"+{miss['lost']}" if miss.get("lost") else ""))
            if miss else None}
