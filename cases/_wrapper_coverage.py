"""Reviewed reasons why no case exercises a registered tico wrapper (wrapper class -> reason).

"Exercised" means a case's QUANT evaluation ran the wrapper's forward, as the case's root
wrapper or as a child (measured: ``harness/wrapper_coverage.py``, snapshot in
``wrapper_coverage.json``). ``tests/test_wrapper_coverage.py`` fails when a registered wrapper
is exercised by no case and has no entry here, and when an entry is stale (a case now
exercises the wrapper, or tico no longer registers it). Checked against tico 0.3.0's source:
TICO's 50 smoke cases (``tico.quantization.recipes.debug.wrapper_smoke``), which the matrix
mirrors, cover the nn / Llama layer / Gemma4 / Gemma4 assistant / Qwen3-VL families only, and
no HF module any case builds contains the float classes below. The CNN-family, activation and
tico-facade wrappers have their own cases in ``cases/cnn.py``; the model-level Llama wrappers
(and the SpinQuant Llama models they also wrap) theirs in ``cases/llama_model.py``.
"""

UNEXERCISED: dict[str, str] = {}
