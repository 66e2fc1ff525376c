"""The BatchEngine: the one thread that touches MLX."""
