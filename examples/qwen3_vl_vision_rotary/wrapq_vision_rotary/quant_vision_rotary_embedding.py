"""``QuantQwen3VLVisionRotaryEmbedding``: a tico wrapq wrapper for the Qwen3-VL vision RoPE.

The Hugging Face module turns (h, w) patch positions into the cos/sin tables every vision
block rotates q/k with. It has no learnable parameters; what quantization has to cover is
its two outputs, so the wrapper owns one observer for cos and one for sin.

Written against the transformers 5.x module (``__init__(config)``,
``forward(x, position_ids) -> (cos, sin)``, axial 2-D RoPE). The wrapper recomputes the
inverse frequencies from the config instead of reading HF's buffer, so a frequency mistake
in the wrapper shows up against the HF module (rotary parity), not only inside it.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.nn as nn
from tico.quantization.config.ptq import PTQConfig
from tico.quantization.wrapq.wrappers.quant_module_base import QuantModuleBase
from tico.quantization.wrapq.wrappers.registry import try_register


def axial_inv_freq(theta: float, head_dim: int) -> torch.Tensor:
    """Inverse frequencies of one spatial axis: half of the head dim rotates with h, half with
    w, and each half pairs its channels, so ``head_dim // 4`` frequencies per axis."""
    axis_dim = head_dim // 2
    exponents = torch.arange(0, axis_dim, 2, dtype=torch.float32) / axis_dim
    return 1.0 / (theta**exponents)


@try_register("transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLVisionRotaryEmbedding")
class QuantQwen3VLVisionRotaryEmbedding(QuantModuleBase):
    """Quantization wrapper for ``Qwen3VLVisionRotaryEmbedding``.

    forward(x, position_ids) -> (cos, sin), each (N, head_dim):
        angles = position_ids[:, axis, None] * inv_freq     (per axis: h, then w)
        table  = [angles_h | angles_w | angles_h | angles_w]
        cos, sin = fake_quant(cos(table)), fake_quant(sin(table))

    ``x`` only tells the device, as in HF. Observers: ``cos`` and ``sin``.
    """

    def __init__(
        self,
        fp_rope: nn.Module,
        *,
        qcfg: Optional[PTQConfig] = None,
        fp_name: Optional[str] = None,
    ):
        super().__init__(qcfg, fp_name=fp_name)
        config = getattr(fp_rope, "config", None)
        if config is None or not hasattr(config, "rope_parameters"):
            raise NotImplementedError(
                "QuantQwen3VLVisionRotaryEmbedding supports the config-based (transformers 5.x) "
                f"Qwen3VLVisionRotaryEmbedding; got {type(fp_rope).__name__} without a config"
            )
        rope_type = config.rope_parameters.get("rope_type", "axial")
        if rope_type != "axial":
            raise NotImplementedError(f"only axial vision RoPE is supported, got rope_type={rope_type!r}")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_heads
        self.theta = float(config.rope_parameters["rope_theta"])
        self.head_dim = int(head_dim)
        self.attention_scaling = float(getattr(fp_rope, "attention_scaling", 1.0))
        self.register_buffer("inv_freq", axial_inv_freq(self.theta, self.head_dim), persistent=False)
        # Kept for reference (fp_name, debugging); it holds buffers only, no parameters.
        self.module = fp_rope

        self.obs_cos = self._make_obs("cos")
        self.obs_sin = self._make_obs("sin")

    def _angles(self, position_ids: torch.Tensor) -> torch.Tensor:
        """(N, 2) integer (h, w) positions -> (N, head_dim) rotation angles in HF's layout."""
        per_axis = position_ids[..., None].to(torch.float32) * self.inv_freq
        angles_hw = torch.cat([per_axis[:, 0], per_axis[:, 1]], dim=-1)
        return torch.cat([angles_hw, angles_hw], dim=-1)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        angles = self._angles(position_ids.to(self.inv_freq.device))
        cos, sin = angles.cos(), angles.sin()
        if self.attention_scaling != 1.0:
            cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
        cos = self._fq(cos, self.obs_cos)
        sin = self._fq(sin, self.obs_sin)
        return cos, sin

    def _all_observers(self) -> Iterable:
        yield self.obs_cos
        yield self.obs_sin
