"""Models: the demo model from its PyPI wheel, the tiny test model, and --model resolution."""
