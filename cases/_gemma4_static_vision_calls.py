"""The call contract of tico's Gemma4 static vision profile (``static_vision_profile.py``), the fixed
image layout tico's Gemma4 export recipes and static runtime build the vision tower's inputs from.

Answers: the default profile, named or written out inline in ``model_args.vision``, lays out the patch
positions as the harness's static layout does (``static_positions``: the image processor's row-major
grid, then (-1, -1) padding slots; HF's processor itself needs torchvision, absent here), and accepts a
processor output and settings laid out that way. Refusals: each geometry, processor, text-span and
model-args inconsistency its validators name, with their own error."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch

from cases import _static_runtime as static
from cases._gemma4_common import static_positions
from harness import Built, CallProbe

IMAGE_TOKEN = 7  # any id: the text-span validators take it as an argument


def _module():
    from tico.quantization.wrapq.wrappers.gemma4 import static_vision_profile

    return static_vision_profile


def static_vision_probes(built: Built) -> list[CallProbe]:
    svp = _module()
    profile = svp.get_gemma4_static_vision_profile(svp.DEFAULT_GEMMA4_STATIC_VISION_PROFILE)
    config = SimpleNamespace(patch_size=profile.patch_size, pooling_kernel_size=3, default_output_length=280)
    max_seq = static.GEMMA4["max_seq"]
    inline = {key: value for key, value in profile.to_vision_model_args().items() if key != "profile"}
    inline.update(image_height=profile.image_height, image_width=profile.image_width)
    ids = torch.zeros(1, profile.visual_end_idx + 3, dtype=torch.long)
    ids[0, profile.visual_start_idx : profile.visual_end_idx] = IMAGE_TOKEN
    outputs = {
        "input_ids": ids,
        "image_position_ids": static_positions(),
        "pixel_values": torch.zeros(1, profile.num_patches, profile.patch_vector_size),
        "num_soft_tokens_per_image": torch.tensor([profile.num_visual_tokens]),
    }
    processor = SimpleNamespace(
        tokenizer=SimpleNamespace(add_bos_token=profile.tokenizer_add_bos_token),
        image_processor=SimpleNamespace(patch_size=profile.patch_size, pooling_kernel_size=3, max_soft_tokens=280),
        image_seq_length=profile.max_soft_tokens,
    )

    def layout(label, make_profile):
        return CallProbe(
            label,
            lambda _m: make_profile().build_image_position_ids(),
            reference=lambda _hf: static_positions(),
            pick=lambda positions: [positions],
        )

    def accepted(label, validate):
        def call(_m):
            validate()
            return profile.build_image_position_ids()

        return CallProbe(label, call, reference=lambda _hf: static_positions(), pick=lambda positions: [positions])

    def refused(label, refusal, call):
        return CallProbe(label, lambda _m: call(), refusal=refusal)

    def changed(**fields):
        return dataclasses.replace(profile, **fields)

    def build(vision, seq=max_seq):
        return lambda: svp.build_gemma4_static_vision_profile({"vision": vision}, vision_config=config, max_seq_len=seq)

    def outputs_with(**changes):
        return lambda: profile.validate_processor_outputs({**outputs, **changes}, image_token_id=IMAGE_TOKEN)

    def processor_with(**changes):
        return lambda: profile.validate_processor(SimpleNamespace(**{**vars(processor), **changes}))

    probes = [
        layout("the default profile, named", lambda: profile),
        layout("the default profile through model_args", build({"profile": profile.name})),
        layout("the default profile written out inline", build(inline)),
        accepted("a processor output in the profile's layout", outputs_with()),
        accepted("processor settings matching the profile", processor_with()),
        accepted(
            "a 1-D id row with the profile's image span",
            lambda: profile.validate_text_input_ids(ids[0], image_token_id=IMAGE_TOKEN),
        ),
        accepted(
            "a wrapped model holding the profile's span",
            lambda: profile.validate_wrapped_model(SimpleNamespace(visual_start_idx=1, num_visual_tokens=264)),
        ),
    ]
    geometry = [
        ("an empty name", "ValueError: .*name must be non-empty", {"name": ""}),
        ("a batch of two", "ValueError: .*batch_size=1", {"batch_size": 2}),
        ("no visual tokens", "ValueError: .*num_visual_tokens must be positive", {"num_visual_tokens": 0}),
        ("a negative visual start", "ValueError: .*visual_start_idx must be non-negative", {"visual_start_idx": -1}),
        (
            "a height the kernel does not divide",
            "ValueError: patch_grid_height must be divisible",
            {"patch_grid_height": 37},
        ),
        (
            "a width the kernel does not divide",
            "ValueError: patch_grid_width must be divisible",
            {"patch_grid_width": 65},
        ),
        (
            "more visual tokens than soft slots",
            "ValueError: num_visual_tokens cannot exceed",
            {"num_visual_tokens": 281},
        ),
        (
            "a token count the grid does not pool to",
            "ValueError: .*visual-token count does not match",
            {"num_visual_tokens": 263},
        ),
    ]
    probes += [
        refused(f"geometry: {label}", refusal, lambda f=fields: changed(**f).validate())
        for label, refusal, fields in geometry
    ]
    probes += [
        refused(
            "a span past max_seq_len",
            "ValueError: The visual-token span exceeds max_seq_len",
            lambda: profile.validate(max_seq_len=100),
        ),
        refused(
            "another patch size than the config's",
            "ValueError: Static profile patch_size does not match",
            lambda: profile.validate(vision_config=SimpleNamespace(**{**vars(config), "patch_size": 14})),
        ),
        refused(
            "another pooling kernel than the config's",
            "ValueError: Static profile pooling_kernel_size does not match",
            lambda: profile.validate(vision_config=SimpleNamespace(**{**vars(config), "pooling_kernel_size": 2})),
        ),
        refused(
            "another soft-token count than the config's",
            "ValueError: Static profile max_soft_tokens does not match",
            lambda: profile.validate(vision_config=SimpleNamespace(**{**vars(config), "default_output_length": 256})),
        ),
        refused(
            "a tokenizer adding BOS",
            "ValueError: Tokenizer add_bos_token does not match",
            processor_with(tokenizer=SimpleNamespace(add_bos_token=not profile.tokenizer_add_bos_token)),
        ),
        refused(
            "an image processor of another patch size",
            "ValueError: Image processor patch_size does not match",
            processor_with(image_processor=SimpleNamespace(patch_size=14)),
        ),
        refused(
            "another image_seq_length",
            "ValueError: Processor image_seq_length does not match",
            processor_with(image_seq_length=256),
        ),
        refused(
            "positions not a tensor",
            "TypeError: image_position_ids must be a torch.Tensor",
            lambda: profile.validate_image_position_ids([0]),
        ),
        refused(
            "positions of another grid",
            "ValueError: image_position_ids does not match",
            lambda: profile.validate_image_position_ids(static_positions().flip(1)),
        ),
        refused(
            "ids of batch two",
            "ValueError: .*requires batch_size=1",
            lambda: profile.validate_text_input_ids(ids.expand(2, -1), image_token_id=IMAGE_TOKEN),
        ),
        refused(
            "3-D ids",
            "ValueError: input_ids must have shape",
            lambda: profile.validate_text_input_ids(ids[None], image_token_id=IMAGE_TOKEN),
        ),
        refused(
            "an image span one token late",
            "ValueError: Processed input_ids do not match",
            lambda: profile.validate_text_input_ids(ids.roll(1, 1), image_token_id=IMAGE_TOKEN),
        ),
        refused("an output without input_ids", "ValueError: .*contain tensor input_ids", outputs_with(input_ids=None)),
        refused(
            "an output without positions",
            "ValueError: .*contain tensor image_position_ids",
            outputs_with(image_position_ids=None),
        ),
        refused(
            "an output without pixels", "ValueError: .*contain tensor pixel_values", outputs_with(pixel_values=None)
        ),
        refused(
            "pixels of another shape",
            "ValueError: pixel_values does not match",
            outputs_with(pixel_values=torch.zeros(1, profile.num_patches - 1, profile.patch_vector_size)),
        ),
        refused(
            "another soft-token count per image",
            "ValueError: num_soft_tokens_per_image does not match",
            outputs_with(num_soft_tokens_per_image=torch.tensor([profile.num_visual_tokens - 1])),
        ),
        refused(
            "a wrapped model with another visual start",
            "ValueError: Wrapped Gemma4 visual_start_idx does not match",
            lambda: profile.validate_wrapped_model(SimpleNamespace(visual_start_idx=0, num_visual_tokens=264)),
        ),
        refused(
            "a wrapped model with another token count",
            "ValueError: Wrapped Gemma4 num_visual_tokens does not match",
            lambda: profile.validate_wrapped_model(SimpleNamespace(visual_start_idx=1, num_visual_tokens=263)),
        ),
        refused(
            "an unknown profile name",
            "ValueError: Unknown Gemma4 static vision profile",
            lambda: svp.get_gemma4_static_vision_profile("e2b_1x1"),
        ),
        refused(
            "model_args.vision not a mapping",
            "TypeError: model_args.vision must be a mapping",
            lambda: svp.canonicalize_gemma4_static_vision_model_args({"vision": ["profile"]}),
        ),
        refused(
            "a field contradicting the named profile",
            "ValueError: model_args.vision conflicts with named",
            lambda: svp.canonicalize_gemma4_static_vision_model_args(
                {"vision": {"profile": profile.name, "num_visual_tokens": 1}}
            ),
        ),
        refused(
            "inline fields missing",
            "ValueError: Gemma4 static vision export requires model_args.vision fields",
            build({"visual_start_idx": 1}),
        ),
        refused(
            "an image height off the grid",
            "ValueError: model_args.vision.image_height does not match",
            build({**inline, "image_height": profile.image_height + 1}),
        ),
        refused(
            "an image width off the grid",
            "ValueError: model_args.vision.image_width does not match",
            build({**inline, "image_width": profile.image_width + 1}),
        ),
    ]
    return probes
