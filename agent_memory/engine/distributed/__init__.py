"""Serving one model across several processes on mx.distributed (docs/architecture.md, "Across processes")."""
