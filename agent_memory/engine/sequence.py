"""A request inside the engine, as the scheduler sees it: its prompt and agent, its state, what
the store lent it, its working KV cache. Its request side (sampling, usage, the text and events
its client gets) is one field, `generation` (generation.py), that scheduling never reads."""

from __future__ import annotations

import enum
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from agent_memory.agent_key import AgentKey
from agent_memory.engine.kinds.attention import StoredRun
from agent_memory.engine.kinds.layers import ModelLayers
from agent_memory.engine.loading.loader import LoadedModel
from agent_memory.engine.requests import GenerationRequest, Sink
from agent_memory.engine.tokens.generation import Generation, new_generation
from agent_memory.memory.hashing import namespace
from agent_memory.memory.index.store import AgentCacheStore
from agent_memory.memory.index.store_records import Lease, Segment
from agent_memory.precision import KVPrecision
from agent_memory.vision.positions import Placement


class Status(enum.Enum):
    WAITING = "waiting"  # admitted; its prompt not looked up yet
    PREFILLING = "prefilling"  # planned: cached blocks (maybe still being read) and gaps to compute
    DECODING = "decoding"  # in the decode batch
    FINISHED = "finished"  # released, committed and reported: exactly once


@dataclass(eq=False)
class Sequence:
    id: int
    request: GenerationRequest
    generation: Generation  # the request side: sampling, usage, output
    submitted: float  # perf_counter() when the request arrived
    cache: list | None  # the working cache while prefilling; the decode batch holds it after
    agent: AgentKey | None  # whose memory the result joins; None once that agent was deleted
    root: str | None  # the namespace (tenant, cache salt) its blocks are named in
    status: Status = Status.WAITING
    new_tokens: int = 0  # prompt tokens its agent's last turn does not cover: a guess at the work
    lease: Lease | None = None  # what the store lent it, from planning until it finishes
    plan: deque[Segment] = field(default_factory=deque)  # what is left to put into `cache`
    reads: dict[str, Future] = field(default_factory=dict)  # block hash -> its tensors, from disk
    # A shared warm tier asked what it holds for this request (shared_sync.py): planned once answered.
    discovery: Future | None = None
    pos: int = 0  # prompt tokens in `cache`
    # Runs of `cache` that came from cached blocks, as those blocks' stored payloads: a commit
    # reuses them rather than quantizing dequantized KV again (which is not exact).
    stored: list[StoredRun] = field(default_factory=list)
    # Snapshots of its state layers it took on the way (their names), for its agent to keep,
    # and the prompt positions where it stops while prefilling to offer what it computed (a
    # head others share, a client's breakpoints: engine/planner.py), ascending.
    snapshots: list[str] = field(default_factory=list)
    marks: list[int] = field(default_factory=list)
    # A follow-up that only computes KV for its agent (see canonical_reply): no decoding.
    # A follow-up that only computes KV for its agent (canonical_reply, or the API's settle): no decoding.
    prefill_only: bool = False
    parent: int | None = None  # a request's sample 1..n-1 (samples.py): its sample 0's id

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt

    @property
    def placement(self) -> Placement | None:
        """Where its image tokens sit, for a model whose images take 3-D positions (vision/positions.py)."""
        return self.request.vision.placement if self.request.vision is not None else None

    @property
    def delta(self) -> int:
        """What its tokens after the last image add to their index: their position as decoded."""
        return self.placement.delta if self.placement is not None else 0

    @property
    def prefill_end(self) -> int:
        """Prompt tokens prefilled before decoding: all but the last, which is fed as the first
        decode step's input; all of them for a prefill-only follow-up."""
        return len(self.prompt) if self.prefill_only else len(self.prompt) - 1

    def ready(self) -> bool:
        """Planned, and every block it reads from disk has arrived."""
        return self.status is Status.PREFILLING and all(f.done() for f in self.reads.values())


def canonical_reply(prompt: list[int], fed: list[int], reply: list[int]) -> tuple[int, list[int] | None]:
    """What a finished turn should leave in its agent's cache: the KV of the tokens the next
    turn will send, which are the prompt plus the reply text *as the tokenizer writes it*
    (`reply`). A model can sample another tokenization of the same text (constrained decoding
    often does), and a stop string is in the KV but not in the text. Returns how many of the
    `fed` tokens (whose KV exists) to keep, and the canonical sequence to compute on top of
    them, or None when the fed tokens already are it."""
    canonical = prompt + reply
    keep = 0
    for a, b in zip(fed, canonical):
        if a != b:
            break
        keep += 1
    return keep, (canonical if keep < len(canonical) else None)


def new_sequence(
    seq_id: int,
    request: GenerationRequest,
    sink: Sink,
    submitted: float,
    loaded: LoadedModel,
    layers: ModelLayers,
    working: KVPrecision,
    store: AgentCacheStore,
) -> Sequence:
    """A request as the engine runs it: its request side (generation.py), working cache, agent
    and namespace; a guess at its new work for the scheduler. A prefill-only request (a
    follow-up, or the API's settle) computes its prompt's KV for its agent and ends. A client's
    request that names no agent, and is to be remembered, joins the unnamed conversation it
    continues, or starts one (memory/index/conversations.py)."""
    prefill_only = request.prefill_only
    root = store.names.root(namespace(request.tenant, request.cache_salt))
    agent = request.agent
    if agent is None and not prefill_only and request.remember:
        agent = store.recognise(request.prompt, root, request.tenant, request.extra_keys)
    seq = Sequence(
        id=seq_id,
        request=request,
        generation=new_generation(request, sink, loaded),
        submitted=submitted,
        cache=layers.new_cache(working),
        agent=agent,
        root=root,
        prefill_only=prefill_only,
    )
    seq.generation.usage.agent = seq.agent
    seq.new_tokens = len(request.prompt) - store.known_prefix(seq.agent, request.prompt)
    if store.sync is not None and not prefill_only:  # a follow-up continues this server's own latest turn
        seq.discovery = store.sync.discover(seq.agent, request.prompt, seq.root, request.extra_keys)
    return seq
