"""Embedding models served beside chat models: which folders hold one, their forward pass, their engine."""
