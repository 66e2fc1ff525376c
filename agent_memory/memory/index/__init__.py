"""The in-memory index: every block this server knows (its tier, references, pins), the agents
that use them, the hot budget, and what a shared warm tier says about them."""
