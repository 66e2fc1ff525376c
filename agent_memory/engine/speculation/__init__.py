"""Speculative decoding: proposals (lookup.py, draft.py) verified in one forward pass of the batch (speculative_batch.py), as wide as pays (verify_width.py)."""
