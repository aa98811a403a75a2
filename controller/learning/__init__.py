"""Edges of the learned models: history, storage, refits, recording, training data, the CLI."""
