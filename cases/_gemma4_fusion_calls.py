"""The call contract of tico's Gemma4 multimodal fusion helpers (``gemma4/utils.py``), which place the
vision tower's soft tokens into the text embeddings: ``dynamic_placeholder_fuse`` (eager, at the image
placeholders), ``fixed_slot_fuse`` (static export, at the layout's fixed slots), the layout validators
and the decode mask builder. Each placement is held to Hugging Face's own fusion, a ``masked_scatter``
of the soft tokens at the placeholder positions (``Gemma4Model.forward``), on prompts with the image
first, in the middle and last; every malformed input is refused with the helper's own error."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from harness import Built, CallProbe

SEQ, HIDDEN, VISUAL = 10, 6, 3


def _utils():
    from tico.quantization.wrapq.wrappers.gemma4 import utils

    return utils


def _hf_fusion(text: torch.Tensor, visual: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """HF Gemma4Model's fusion: the soft tokens scattered, in order, into the placeholder positions."""
    return text.masked_scatter(mask[..., None].expand_as(text), visual.to(text.dtype))


def fusion_probes(built: Built) -> list[CallProbe]:
    u = _utils()
    generator = torch.Generator().manual_seed(5)
    text = torch.randn(1, SEQ, HIDDEN, generator=generator)
    visual = torch.randn(1, VISUAL, HIDDEN, generator=generator)

    def span(start: int) -> torch.Tensor:
        mask = torch.zeros(1, SEQ, dtype=torch.bool)
        mask[:, start : start + VISUAL] = True
        return mask

    def placed(label, call, start):
        return CallProbe(
            label, lambda _m: call(), reference=lambda _hf: _hf_fusion(text, visual, span(start)), pick=lambda t: [t]
        )

    def refused(label, refusal, call):
        return CallProbe(label, lambda _m: call(), refusal=refusal)

    probes = []
    for start, where in ((0, "first"), (4, "in the middle"), (SEQ - VISUAL, "last")):
        probes += [
            placed(
                f"fixed slots, image {where}",
                lambda s=start: u.fixed_slot_fuse(text, visual, visual_start_idx=s, num_visual_tokens=VISUAL),
                start,
            ),
            placed(
                f"placeholders, image {where}", lambda s=start: u.dynamic_placeholder_fuse(text, visual, span(s)), start
            ),
            placed(
                f"the layout validated, image {where}",
                lambda s=start: (
                    u.validate_static_visual_layout(
                        span(s)[..., None], visual_start_idx=s, num_visual_tokens=VISUAL, seq_len=SEQ
                    )
                    or u.fixed_slot_fuse(text, visual[0], visual_start_idx=s)
                ),
                start,
            ),
        ]
    probes.append(
        CallProbe(
            "the whole prompt as soft tokens",
            lambda _m: u.fixed_slot_fuse(text[:, :VISUAL], visual, visual_start_idx=0),
            reference=lambda _hf: visual,
            pick=lambda t: [t],
        )
    )
    layout = u.StaticGemma4Layout(max_seq=SEQ, visual_start_idx=2, num_visual_tokens=VISUAL)
    probes += [
        refused(
            "fixed slots: 2-D text",
            "ValueError: text_embeds must be rank 3",
            lambda: u.fixed_slot_fuse(text[0], visual, visual_start_idx=0),
        ),
        refused(
            "fixed slots: 4-D soft tokens",
            "ValueError: visual_embeds must be rank 3",
            lambda: u.fixed_slot_fuse(text, visual[None], visual_start_idx=0),
        ),
        refused(
            "fixed slots: another width",
            "ValueError: visual_embeds shape is incompatible",
            lambda: u.fixed_slot_fuse(text, visual[..., :-1], visual_start_idx=0),
        ),
        refused(
            "fixed slots: another count",
            "ValueError: Visual token count mismatch",
            lambda: u.fixed_slot_fuse(text, visual, visual_start_idx=0, num_visual_tokens=VISUAL + 1),
        ),
        refused(
            "fixed slots: past the prompt",
            "ValueError: Invalid visual slot range",
            lambda: u.fixed_slot_fuse(text, visual, visual_start_idx=SEQ - 1),
        ),
        refused(
            "placeholders: 2-D text",
            "ValueError: text_embeds must be rank 3",
            lambda: u.dynamic_placeholder_fuse(text[0], visual, span(0)),
        ),
        refused(
            "placeholders: 4-D soft tokens",
            "ValueError: visual_embeds must be rank 3",
            lambda: u.dynamic_placeholder_fuse(text, visual[None], span(0)),
        ),
        refused(
            "placeholders: another width",
            "ValueError: visual_embeds shape is incompatible",
            lambda: u.dynamic_placeholder_fuse(text, visual[..., :-1], span(0)),
        ),
        refused(
            "placeholders: fewer placeholders than tokens",
            "ValueError: Image placeholder count must match",
            lambda: u.dynamic_placeholder_fuse(text, visual, span(0) & (torch.arange(SEQ) < 2)),
        ),
        refused(
            "placeholders: a 4-D mask",
            "ValueError: image_mask must have shape",
            lambda: u.dynamic_placeholder_fuse(text, visual, span(0)[None, ..., None]),
        ),
        refused(
            "placeholders: a mask of another length",
            "ValueError: image_mask shape is incompatible",
            lambda: u.dynamic_placeholder_fuse(text, visual, span(0)[:, 1:]),
        ),
        refused(
            "layout: a 4-D mask",
            "ValueError: image_mask must have shape",
            lambda: u.validate_static_visual_layout(
                span(0)[None, ..., None], visual_start_idx=0, num_visual_tokens=VISUAL
            ),
        ),
        refused(
            "layout: another length",
            "ValueError: image_mask sequence length does not match",
            lambda: u.validate_static_visual_layout(
                span(0), visual_start_idx=0, num_visual_tokens=VISUAL, seq_len=SEQ + 1
            ),
        ),
        refused(
            "layout: a negative start",
            "ValueError: visual_start_idx must be non-negative",
            lambda: u.validate_static_visual_layout(span(0), visual_start_idx=-1, num_visual_tokens=VISUAL),
        ),
        refused(
            "layout: a negative count",
            "ValueError: num_visual_tokens must be non-negative",
            lambda: u.validate_static_visual_layout(span(0), visual_start_idx=0, num_visual_tokens=-1),
        ),
        refused(
            "layout: past the prompt",
            "ValueError: Static visual-token span exceeds",
            lambda: u.validate_static_visual_layout(span(0), visual_start_idx=SEQ - 1, num_visual_tokens=VISUAL),
        ),
        refused(
            "layout: placeholders off their slots",
            "ValueError: Image placeholder layout does not match",
            lambda: u.validate_static_visual_layout(span(1), visual_start_idx=0, num_visual_tokens=VISUAL),
        ),
        refused(
            "static layout: a batch of two",
            "ValueError: .*batch_size=1 only",
            lambda: u.StaticGemma4Layout(SEQ, 2, VISUAL, batch_size=2).validate(),
        ),
        refused(
            "static layout: no sequence",
            "ValueError: max_seq must be positive",
            lambda: u.StaticGemma4Layout(0, 0, 0).validate(),
        ),
        refused(
            "static layout: a negative start",
            "ValueError: visual_start_idx must be non-negative",
            lambda: u.StaticGemma4Layout(SEQ, -1, VISUAL).validate(),
        ),
        refused(
            "static layout: a negative count",
            "ValueError: num_visual_tokens must be non-negative",
            lambda: u.StaticGemma4Layout(SEQ, 0, -1).validate(),
        ),
        refused(
            "static layout: past the window",
            "ValueError: Visual token range exceeds max_seq",
            lambda: u.StaticGemma4Layout(SEQ, SEQ - 1, VISUAL).validate(),
        ),
        refused(
            "decode mask: a full past",
            "ValueError: past_len must be in",
            lambda: u.build_decode_attention_mask(
                batch_size=1, past_len=SEQ, max_seq=SEQ, device="cpu", dtype=torch.float32, mask_value=-120.0
            ),
        ),
        refused(
            "a config with the MoE block",
            "ValueError: .*dense decoder layers only",
            lambda: u.assert_gemma4_e2b_no_moe(SimpleNamespace(text_config=SimpleNamespace(enable_moe_block=True))),
        ),
    ]
    probes.append(
        placed(
            "a validated static layout's slots",
            lambda: layout.validate() or u.fixed_slot_fuse(text, visual, visual_start_idx=layout.visual_start_idx),
            2,
        )
    )
    return probes
