"""What an engine shows its operator: Prometheus families (metrics.py), the trace file (trace.py), /health and the ready line (report.py)."""
