"""The verified width of a speculative step (engine/verify_width.py): as wide as pays for the
decoding sequences, and narrower while prompts wait for their prefill behind the step."""

from __future__ import annotations

from agent_memory.engine.verify_width import VerifyWidth

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
    assert VerifyWidth().choose([4] * 8, [0.9] * 8, waiting=30) == 5


def test_with_nothing_waiting_likely_proposals_are_verified_whole():
    assert learnt().choose([4] * 8, [0.9] * 8) == 5


def test_unlikely_proposals_are_not_verified():
    assert learnt().choose([4] * 8, [0.05] * 8) == 1


def test_waiting_prompts_narrow_the_step_down_to_plain_decoding():
    width = learnt()
    widths = [width.choose([4] * 8, [0.6] * 8, waiting=q) for q in range(0, 41, 4)]
    assert widths[0] > 1 and widths[-1] == 1
    assert widths == sorted(widths, reverse=True)  # never wider for a longer queue
