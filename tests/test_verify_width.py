"""How much a speculative step verifies (engine/speculation/verify_width.py, engine/speculation/speculative_batch.py):
as wide as pays for the decoding sequences, and nothing at all while a client waits for its
first token, so that speculation never makes a returning agent wait."""

from __future__ import annotations

import pytest

from agent_memory.engine.speculation.verify_width import VerifyWidth

FIXED, PER = 0.20, 0.010  # seconds a step, seconds a position: this CPU's order of magnitude


def learnt() -> VerifyWidth:
    """A width model that has seen steps of 8 rows at every width from 1 to 5."""
    width = VerifyWidth()
    for _ in range(4):
        for w in range(1, 6):
            width.observe(8 * w, FIXED + PER * 8 * w)
    return width


def test_the_cost_is_learnt_from_the_steps_seen():
    fixed, per = learnt().cost()
    assert abs(fixed - FIXED) < 1e-6 and abs(per - PER) < 1e-6


def test_before_anything_is_learnt_every_proposal_is_verified():
    assert VerifyWidth().choose([4] * 8, [0.9] * 8) == 5


def test_likely_proposals_are_verified_whole_and_unlikely_ones_not_at_all():
    assert learnt().choose([4] * 8, [0.9] * 8) == 5
    assert learnt().choose([4] * 8, [0.05] * 8) == 1


@pytest.fixture(scope="module")
def repeating_batch(tmp_path_factory):
    """A speculative batch of one sequence whose prompt repeats itself, so prompt lookup has
    proposals at every step, on a tiny model with tied embeddings (its greedy output repeats)."""
    from agent_memory.engine.speculation.speculative_batch import SpeculativeBatch  # first: OpenBLAS before MLX

    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    from agent_memory.engine.tokens.sampling import make_sampler
    from agent_memory.models.tiny import build_tiny

    folder = build_tiny(tmp_path_factory.mktemp("models") / "tied", config={"tie_word_embeddings": True})
    model, _ = load(str(folder))

    def start() -> SpeculativeBatch:
        prompt = [300, 301, 302, 303] * 16
        cache = make_prompt_cache(model)
        model(mx.array(prompt[:-1])[None], cache=cache)
        mx.eval([c.state for c in cache])
        batch = SpeculativeBatch(model, eos_token_ids=[0])
        batch.add(1, prompt, cache, make_sampler(0.0, 1.0, None, 0), [], 200)
        return batch

    return start


def proposed(batch, waiting: bool) -> int:
    batch.step(waiting)
    return sum(v.proposed for v in batch.verified)


def test_nothing_is_verified_while_a_client_waits_for_its_first_token(repeating_batch):
    batch = repeating_batch()
    assert proposed(batch, False) == 0  # its own first token is still to come: a plain step
    # Nobody waits: once its output repeats what it wrote, its continuation is proposed.
    assert any(proposed(batch, False) for _ in range(40))
    assert [proposed(batch, True) for _ in range(5)] == [0] * 5  # a prompt waits for its prefill
