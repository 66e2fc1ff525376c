"""The warm tier in a Redis several servers share: its URLs, keys and scripts, the server's backend, and the `cache` commands' view."""
