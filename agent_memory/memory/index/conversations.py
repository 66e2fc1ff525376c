"""ConversationIndex: which unnamed conversation a request that names no agent continues.

A client that sends no agent id (opencode, aider, `llm`, Qwen Code) still sends each turn as
the previous one's prompt and reply plus its new message. Such a request joins the unnamed
record (kind UNNAMED, agent_key.py) whose tokens its prompt continues, and from then on is
remembered like a named agent's turn. The rules (`recognise`):

1. next turn: the record's tokens, but at most SLACK of its last ones (half of a shorter
   record's) — an end-of-turn token, a reply the template writes back a little differently —
   are a prefix of the prompt;
2. resend or retry: the prompt is the record's latest client turn's again (its first
   `turn_start` tokens, and at most SLACK more);
   in both, a token an image fixes (an extra key, memory/hashing.py) matches only under the same
   image: another picture at the same place is a rewritten history, as another word is;
3. otherwise a new conversation, its id a hash of its namespace and first prompt. A prompt that
   shares only the start of a record (a fork, a rewritten history) never moves that record: it
   still reuses the shared blocks through the ordinary lookup.

Ties (two conversations opened with the same first prompt) go to the longest match, then the
latest used. Each record is filed under two anchors, the names of its last whole block before
each rule's boundary (of its first tokens up to there, for a record shorter than a block), so a
request compares tokens only with the records its own names reach, and only past the anchor.
Cost per unnamed request: its block names (one blake2b per block, and one per token of its first
block), a dict lookup each and a compare of at most a block plus SLACK tokens per candidate;
named requests pay nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from agent_memory.agent_key import UNNAMED, AgentKey
from agent_memory.memory.hashing import BlockNames, SpanKey
from agent_memory.memory.index.prefix import common_prefix
from agent_memory.memory.index.store_records import AgentRecord

SLACK = 16  # trailing record tokens a next turn may differ in
ID_BYTES = 8  # an unnamed conversation's id: 16 hex digits

# A block name; before the first whole block, ("head", the name of the first tokens) or ("root", namespace root).
Anchor = str | tuple[str, str | None]


class ConversationIndex:
    def __init__(self, names: BlockNames) -> None:
        self.names = names
        self.block_tokens = names.block_tokens
        self.anchors: dict[Anchor, set[AgentKey]] = {}
        self.filed: dict[AgentKey, tuple[Anchor, ...]] = {}  # each record's anchors, to take it out

    def file(self, key: AgentKey, record: AgentRecord) -> None:
        """(Re)file an unnamed record under its anchors; other kinds are not filed."""
        if key.kind != UNNAMED:
            return
        self.remove(key)
        ends = {boundary(record), *([record.turn_start] if record.turn_start else [])}
        anchors = tuple({self._anchor(record, end) for end in ends})
        for anchor in anchors:
            self.anchors.setdefault(anchor, set()).add(key)
        self.filed[key] = anchors

    def remove(self, key: AgentKey) -> None:
        for anchor in self.filed.pop(key, ()):
            keys = self.anchors[anchor]
            keys.discard(key)
            if not keys:
                del self.anchors[anchor]

    def _anchor(self, record: AgentRecord, end: int) -> Anchor:
        """The name of the record's last whole block ending at or before `end`; before the first
        block's end, the name of its first `end` tokens (so short conversations are not all
        compared with every short request)."""
        whole = min(end // self.block_tokens, len(record.tokens) // self.block_tokens)
        if whole:
            return record.blocks[whole - 1]
        return ("head", self.names.block_hash(record.root, record.tokens[:end])) if end else ("root", record.root)

    def recognise(
        self,
        tokens: Sequence[int],
        chain: Sequence[tuple[str, str | None, int, int]],
        root: str | None,
        tenant: str,
        records: Mapping[AgentKey, AgentRecord],
        extras: Sequence[SpanKey] = (),
    ) -> AgentKey:
        """The unnamed conversation a prompt continues (its block `chain` named from `root`, the
        namespace of `tenant`; `extras`: what fixes its KV beyond its tokens), or a new one's key."""
        proven: dict[AgentKey, int] = {key: 0 for key in self.anchors.get(("root", root), ())}
        for n in range(1, min(self.block_tokens, len(tokens) + 1)):  # short records' anchors
            for key in self.anchors.get(("head", self.names.block_hash(root, tokens[:n])), ()):
                proven[key] = n
        for h, _, start, end in chain:
            if end - start == self.block_tokens:
                for key in self.anchors.get(h, ()):
                    proven[key] = max(proven.get(key, 0), end)
        best: tuple[int, float, AgentKey] | None = None
        for key, start in proven.items():
            record = records.get(key)
            if record is None or key.tenant != tenant or record.root != root:
                continue
            matched = start + common_prefix(record.tokens[start:], tokens[start:])
            matched = same_extras_until(record.extras, extras, matched)
            if continues(record, matched, len(tokens)):
                candidate = (matched, record.last_used, key)
                best = candidate if best is None or candidate[:2] > best[:2] else best
        if best is not None:
            return best[2]
        return new_key(tokens, chain, root, tenant, records)


def same_extras_until(held: Sequence[SpanKey], sent: Sequence[SpanKey], matched: int) -> int:
    """How much of `matched` equal tokens are the same under their extra keys too: up to the
    first span (an image) that one side has there and the other has not."""
    differing = set(held).symmetric_difference(sent)
    return min([matched, *(s.start for s in differing if s.start < matched)])


def boundary(record: AgentRecord) -> int:
    """How much of a record a next turn must begin with: all but SLACK tokens (half a shorter one's)."""
    return len(record.tokens) - min(SLACK, len(record.tokens) // 2)


def continues(record: AgentRecord, matched: int, prompt: int) -> bool:
    """Whether a prompt of `prompt` tokens, `matched` of them the record's first, is its next
    turn (rule 1) or its latest turn sent again (rule 2)."""
    if not record.tokens:
        return False
    next_turn = matched >= boundary(record)
    resend = record.turn_start > 0 and matched >= record.turn_start and prompt <= record.turn_start + 1 + SLACK
    return next_turn or resend


def new_key(
    tokens: Sequence[int],
    chain: Sequence[tuple[str, str | None, int, int]],
    root: str | None,
    tenant: str,
    records: Mapping[AgentKey, AgentRecord],
) -> AgentKey:
    """A new conversation's key: a hash of its namespace root and first prompt's name, the same
    on every server and after a restart; a conversation opened with the same first prompt as
    one still held gets the next free id."""
    name = chain[-1][0] if chain else ""
    for n in range(len(records) + 1):
        raw = f"{root or ''}\0{name}\0{len(tokens)}\0{n}".encode()
        key = AgentKey(hashlib.blake2b(raw, digest_size=ID_BYTES).hexdigest(), tenant, UNNAMED)
        if key not in records:
            return key
    raise AssertionError("unreachable: one of len(records) + 1 ids is free")
