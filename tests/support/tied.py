"""A tiny model whose embeddings are tied, so its greedy output repeats what it has written, and
its one-layer draft: the prompts and bias that make speculation both accept and reject proposals
(the speculation and sampling-field tests share them)."""

from __future__ import annotations

import pytest

CODE = "\n".join(f"def handler_{i}(request):\n    return request.get('field_{i}', {i})" for i in range(8))
PROMPTS = [
    f"Rewrite this file with one change:\n{CODE}",
    "Copy this list: " + ", ".join(f"item_{i} = value_{i}" for i in range(16)),
    "Describe the harbour at dawn.",
    "List three uses of a lighthouse.",
]
ANSWER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}

# A few tokens only: the output repeats itself in part, so proposals are both accepted and rejected.
FEW = {"logit_bias": {str(t): 30 for t in range(300, 304)}}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny model whose embeddings are tied, so its greedy output repeats what it has written:
    proposals that get accepted; and its draft, a model of one layer with the same tokenizer,
    whose guesses the model accepts in part."""
    from agent_memory.models.tiny import build_tiny

    folder = tmp_path_factory.mktemp("models")
    model = build_tiny(folder / "tied", config={"tie_word_embeddings": True})
    draft = build_tiny(folder / "draft", config={"tie_word_embeddings": True, "num_hidden_layers": 1})
    return model, draft
