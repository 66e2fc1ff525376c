"""What an engine records for its operator: its Prometheus families (metrics.py) and the
trace file (trace.py)."""
