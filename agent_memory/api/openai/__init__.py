"""The OpenAI wire format: chat and text completions, the model list."""
