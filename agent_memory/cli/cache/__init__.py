"""`agent-memory cache`: the commands (commands.py) over the disk tier's files, without MLX."""
