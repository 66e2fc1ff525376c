"""The operator's side of the warm tier, for the `cache` commands: one model folder as found, and verify, delete, prune."""
