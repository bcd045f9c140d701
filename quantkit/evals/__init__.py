"""Accuracy deltas against the original: perplexity, KL divergence, top-1 agreement, lm-eval tasks."""
