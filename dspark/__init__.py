"""dspark: our PyTorch implementation of DSpark/DFlash speculative decoding for Qwen3 targets.

model (target, draft, layers), sampling, engine, drafters, checkpoint (config, loading, formats).
"""

__version__ = "0.1.0"
