"""The warm tier: blocks and manifests kept beyond memory, in a model folder or a shared Redis;
their format, the threads that write and read them, and the operator's checks and deletions."""
