"""Agent memory, in two halves: the in-memory index (index/: blocks, agents, the store and its
hot budget) and the warm tier it writes through (warm/: its format, its backends, its admin).
Both name blocks by one hash chain (hashing.py). No MLX here."""
