"""Whether the optional fairseq profile can run in this interpreter (cases/fairseq.py, cases/fairseq_models.py).

fairseq is not in the pinned stack: ``./scripts/fairseq.sh install`` builds the thin venv
``.venv-fairseq`` that holds it, and ``./scripts/fairseq.sh run`` runs pytest there. Anywhere else
the profile's items skip with the reason below, which names those commands.
"""

from __future__ import annotations

import importlib

INSTALL_COMMAND = "./scripts/fairseq.sh install"
RUN_COMMAND = "./scripts/fairseq.sh run"
# The classes tico 0.3.0 registers wrappers for (try_register in wrappers/fairseq/).
REGISTERED = (
    "fairseq.modules.multihead_attention.MultiheadAttention",
    "fairseq.modules.transformer_layer.TransformerEncoderLayerBase",
    "fairseq.modules.transformer_layer.TransformerDecoderLayerBase",
    "fairseq.models.transformer.TransformerEncoderBase",
    "fairseq.models.transformer.TransformerDecoderBase",
)


def unavailable_reason() -> str | None:
    """None when every class tico wraps imports; else why not, with the commands to fix it. Asked once per
    session through Case.unavailable, which keeps the answer."""
    for path in REGISTERED:
        module_name, _, class_name = path.rpartition(".")
        try:
            getattr(importlib.import_module(module_name), class_name)
        except Exception as exc:  # noqa: BLE001 - an import that fails in any way is the reason to report
            return (
                f"the fairseq profile needs fairseq ({path}: {type(exc).__name__}: {exc}); "
                f"run it with `{RUN_COMMAND}` (after `{INSTALL_COMMAND}`)"
            )
    return None


def where() -> str:
    import fairseq

    return str(fairseq.__file__)
