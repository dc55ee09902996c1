"""Reviewed reasons why no case exercises a registered tico wrapper (wrapper class -> reason).

"Exercised" means a case's QUANT evaluation ran the wrapper's forward, as the case's root
wrapper or as a child (measured: ``harness/wrapper_coverage.py``, snapshot in
``wrapper_coverage.json``). ``tests/test_wrapper_coverage.py`` fails when a registered wrapper
is exercised by no case and has no entry here, and when an entry is stale (a case now
exercises the wrapper, or tico no longer registers it). Checked against tico 0.3.0's source:
TICO's 50 smoke cases (``tico.quantization.recipes.debug.wrapper_smoke``), which the matrix
mirrors, cover the nn / Llama layer / Gemma4 / Gemma4 assistant / Qwen3-VL families only, and
no HF module any case builds contains the float classes below.
"""

_CNN = ("CNN-family wrapper (tico registers it in wrapq/wrappers/{path}); TICO's 50 smoke cases "
        "have no CNN case and no HF module in the matrix contains {float}, so no case wraps it")
_ACT = ("elementwise activation wrapper (wrapq/wrappers/quant_elementwise.py, @register({float})); "
        "none of the HF modules in the matrix uses {float} (they use SiLUActivation, GELU and "
        "GELUTanh, which are exercised)")
_FACADE = ("wraps {float}, tico's own {what} (tico/ops/{path}) that a user inserts into a model; "
           "no HF model contains it and TICO's smoke has no case")

UNEXERCISED: dict[str, str] = {
    "QuantConv2d": _CNN.format(path="nn/quant_conv2d.py", float="torch.nn.Conv2d"),
    "QuantConvTranspose2d": _CNN.format(path="nn/quant_conv_transpose2d.py", float="torch.nn.ConvTranspose2d"),
    "QuantMaxPool2d": _CNN.format(path="nn/quant_maxpool2d.py", float="torch.nn.MaxPool2d"),
    "QuantPReLU": _CNN.format(path="nn/quant_prelu.py", float="torch.nn.PReLU"),
    "QuantReLU": _ACT.format(float="nn.ReLU"),
    "QuantReLU6": _ACT.format(float="nn.ReLU6"),
    "QuantSigmoid": _ACT.format(float="nn.Sigmoid"),
    "QuantTanh": _ACT.format(float="nn.Tanh"),
    "QuantELU": _ACT.format(float="nn.ELU"),
    "QuantConcat": _FACADE.format(float="tico.ops.Concat", path="concat.py",
                                  what="module facade for a quantizable concatenation boundary"),
    "QuantResizeBilinear2d": _FACADE.format(float="tico.ops.ResizeBilinear2d", path="resize_bilinear.py",
                                            what="PyTorch facade for Circle RESIZE_BILINEAR semantics"),
    "QuantSamePaddingConv2d": _FACADE.format(float="tico.ops.SamePaddingConv2d", path="same_padding_conv2d.py",
                                             what="Circle-compatible SAME-padding Conv2d facade"),
    "QuantStubWrapper": ("wraps tico.quantization.QuantStub, an identity module a user places at a model "
                         "boundary to get an explicit activation observer (tico/quantization/quant_stub.py); "
                         "no HF model contains one and TICO's smoke has no case"),
    "QuantLlamaModel": ("Llama model-level wrapper (LlamaModel and SpinQuant's SpinLlamaModel, whose "
                        "rotate_embedding it also wraps); TICO's Llama smoke stops at LlamaDecoderLayer, so "
                        "the matrix has no Llama model case yet (pending #19 item 3)"),
    "QuantLlamaForCausalLM": ("Llama causal-LM wrapper (LlamaForCausalLM and SpinQuant's SpinLlamaForCausalLM, "
                              "whose rotate_lm_head it also wraps); TICO's Llama smoke stops at "
                              "LlamaDecoderLayer, so the matrix has no Llama causal-LM case yet (pending #19 item 3)"),
}
