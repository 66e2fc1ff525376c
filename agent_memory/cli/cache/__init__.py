"""`agent-memory cache`: the commands (commands.py) over the warm tier (a cache folder's files
or a shared Redis namespace), without MLX."""
