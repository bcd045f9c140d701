"""Quantization methods: the registry (method_registry.py, `METHODS` by the recipe's `quantize.method`),
each method's recipe config (configs.py) and the modules that run them: llm-compressor's
methods (llmc.py, autoround.py, with rotations from rotation.py) and bitsandbytes (bnb.py)."""
