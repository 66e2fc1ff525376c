"""Each model family's reply format: how it writes tool calls and reasoning."""
