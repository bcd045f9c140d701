"""quantkit: quantize, GQA-convert, evaluate and benchmark LLM checkpoints."""

__version__ = "0.1.0"
