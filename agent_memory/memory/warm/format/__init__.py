"""The warm tier's format, wherever it is stored: block files and the records (manifests, block metadata, server.json)."""
