"""The HTTP API: the FastAPI app, the OpenAI, Anthropic Messages and Responses routes, agent
routes, the dashboard, middleware."""
