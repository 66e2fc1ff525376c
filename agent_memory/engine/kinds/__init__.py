"""Layer kinds: how each kind of mlx-lm cache is kept across requests (see layers.py)."""
