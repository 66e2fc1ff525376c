"""Speculative decoding: proposals (lookup.py, draft.py) verified in one forward pass of the
batch (speculative_batch.py), as many positions as pay (verify_width.py)."""
