"""Wire-format independent chat: the conversation, tools, how they render into a prompt, and
how generated text turns back into text and tool calls."""
