"""A sequence's tokens, chosen and turned into its client's text: the sampler (sampling.py),
logits processors (penalties.py, constraint.py's grammar mask), logprobs (logprobs.py), text
and stop strings (detokenizer.py, stops.py, output.py), held per sequence as its `Generation`
(generation.py), which scheduling never reads."""
