"""Limits for profile 'real_weights' (SmolLM2-135M-Instruct, cases/llama_real_weights.py)."""

LIMITS = {}
