"""The HTTP API: FastAPI app, OpenAI adapter, agent routes, middleware."""
