"""Out-of-tree PTQ wrapper for Hugging Face's ``Qwen3VLVisionRotaryEmbedding``.

Importing this package registers ``QuantQwen3VLVisionRotaryEmbedding`` in tico's wrapper
registry, so ``tico.quantization.prepare()`` wraps the rotary module with it. Import it
before calling ``prepare()`` (tico only imports its own core wrappers by itself).
"""

from wrapq_vision_rotary.quant_vision_rotary_embedding import QuantQwen3VLVisionRotaryEmbedding

__all__ = ["QuantQwen3VLVisionRotaryEmbedding"]
