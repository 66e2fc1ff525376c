"""The one serving path every wire format shares (serve.py), and its steps."""
