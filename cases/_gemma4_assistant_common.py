"""What the Gemma4 assistant cases share: the transformers module they need and TICO's tiny assistant
config (2 shared-KV layers, ordered embeddings), with a shuffled token ordering."""

from __future__ import annotations

import torch

ASSISTANT_REQUIRES = ("transformers.models.gemma4_assistant.modeling_gemma4_assistant",)
ASSISTANT_MIN_VERSIONS = {"transformers": "5.9"}


def assistant_config(profile: str):
    """TICO's tiny assistant: 2 shared-KV layers (sliding, full), ordered embeddings with 8
    centroids (top-2), tied LM head, eager attention."""
    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig
    from transformers.models.gemma4_assistant.configuration_gemma4_assistant import Gemma4AssistantConfig

    if profile != "tiny":
        raise ValueError(f"unknown Gemma4 assistant profile {profile!r}")
    text = Gemma4TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=32,
        max_position_embeddings=128,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
        rope_parameters={
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        attention_bias=False,
        attention_dropout=0.0,
        use_cache=False,
        enable_moe_block=False,
        num_kv_shared_layers=2,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0,
        allow_global_per_layer_attribute_access=True,
    )
    config = Gemma4AssistantConfig(
        text_config=text,
        backbone_hidden_size=24,
        use_ordered_embeddings=True,
        num_centroids=8,
        centroid_intermediate_top_k=2,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    return config


def random_token_ordering(embedder: torch.nn.Module) -> None:
    """A fresh module orders the vocabulary 0..V-1; a trained one does not, so shuffle it (a
    gather bug would be invisible under the identity ordering)."""
    with torch.no_grad():
        embedder.token_ordering.copy_(torch.randperm(embedder.token_ordering.numel()))
