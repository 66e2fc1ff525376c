"""The decode batch: how running sequences decode together (decode_batch.py) and the batch caches
mlx-lm lacks (quantized.py: Q4/Q8 KV; ragged_kv.py: rows that drop their own positions)."""
