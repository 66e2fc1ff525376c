"""Vision models: a prompt's images made into the model's inputs (prompt.py, on the tokenizer
thread) and into the language model's input embeddings (tower.py, on the engine thread)."""
