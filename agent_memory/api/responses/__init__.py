"""The OpenAI Responses wire format: `/v1/responses`, its stored responses."""
