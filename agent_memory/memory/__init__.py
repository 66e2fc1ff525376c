"""Agent memory: blocks of KV in tiers, the prefix index and the per-agent store."""
