"""A served model in and out of memory: its files read (loader.py), its warm tier opened
(warm.py), its weights loaded and unloaded by the lifecycle both engines share (weights.py)
within one memory limit for every served model (residency.py, budget.py)."""
