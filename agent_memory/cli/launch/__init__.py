"""`agent-memory launch`: coding agents run against this server (command.py). No MLX here."""

from agent_memory.cli.launch.command import launch

__all__ = ["launch"]
