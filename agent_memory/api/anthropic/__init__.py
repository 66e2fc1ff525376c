"""The Anthropic Messages wire format: `/v1/messages` and its token count."""
