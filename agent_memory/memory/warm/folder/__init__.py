"""The warm tier in a model folder on this machine: where each file lives, the server's backend, and what the disk can hold."""
