"""Language-model quality, float vs quantized: perplexity of each on the evaluation text, next-token
top-1 agreement, and KL(float || quant) of the next-token distributions.

For a case with a language-model head (``Case.language_model``), from the Hugging Face and the
QUANT logits the pipeline already computed for every evaluation sample: each valid position
whose successor is a valid token predicts that token. Reported per sample (``ppl_float[name]``)
and pooled over every evaluation sample (the unsuffixed keys: each position counts once).

* ``ppl_float`` / ``ppl_quant``: exp(mean next-token negative log-likelihood);
  ``ppl_ratio`` = ppl_quant / ppl_float (gated by ``max_ppl_ratio``);
* ``top1_agreement``: the fraction of positions whose argmax token is the same (gated by
  ``min_top1_agreement``);
* ``kl_divergence``: mean over positions of KL(p_float || p_quant) in nats (gated by
  ``max_kl_divergence``).

Not applicable to a case without a language-model head (its output is no next-token logits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.checks.base import Check, CheckResult, Metric, requires_capability


@dataclass(frozen=True)
class Settings:
    max_ppl_ratio: float | None = None
    min_top1_agreement: float | None = None
    max_kl_divergence: float | None = None


def _positions(ids: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """(B, S-1) bool: position t predicts token t+1, both real tokens."""
    if valid is None:
        valid = torch.ones_like(ids, dtype=torch.bool)
    valid = valid.to(torch.bool)
    return valid[:, :-1] & valid[:, 1:]


def sample_stats(
    ref_logits: torch.Tensor, quant_logits: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor | None
) -> dict[str, float]:
    """Sums over the sample's predicting positions (pooled later)."""
    keep = _positions(ids, valid)
    targets = ids[:, 1:][keep]
    ref = torch.log_softmax(ref_logits[:, :-1].double(), dim=-1)[keep]
    quant = torch.log_softmax(quant_logits[:, :-1].double(), dim=-1)[keep]
    n = int(targets.numel())
    if n == 0:
        return {"n": 0}
    nll_ref = -ref.gather(-1, targets[:, None]).squeeze(-1)
    nll_quant = -quant.gather(-1, targets[:, None]).squeeze(-1)
    kl = (ref.exp() * (ref - quant)).sum(-1)
    agree = (ref.argmax(-1) == quant.argmax(-1)).double()
    return {
        "n": n,
        "nll_float": float(nll_ref.sum()),
        "nll_quant": float(nll_quant.sum()),
        "kl": float(kl.sum()),
        "agree": float(agree.sum()),
        "kl_max": float(kl.max()),
    }


def _metrics(stats: dict[str, float]) -> dict[str, float]:
    n = stats["n"]
    ppl_float = math.exp(stats["nll_float"] / n)
    ppl_quant = math.exp(stats["nll_quant"] / n)
    return {
        "ppl_float": ppl_float,
        "ppl_quant": ppl_quant,
        "ppl_ratio": ppl_quant / ppl_float,
        "top1_agreement": stats["agree"] / n,
        "kl_divergence": stats["kl"] / n,
        "kl_divergence_max": stats["kl_max"],
        "predicted_tokens": n,
    }


def run(pipeline) -> CheckResult:
    result = CheckResult()
    th = pipeline.check_settings(CHECK)
    lm = pipeline.case.language_model
    pooled = {"n": 0, "nll_float": 0.0, "nll_quant": 0.0, "kl": 0.0, "agree": 0.0, "kl_max": 0.0}
    for name, sample in pipeline.built.inputs.evaluation.items():
        ref = pipeline.output("reference", name)
        quant = pipeline.output("quant", name)
        ids = lm.token_ids(sample)
        if ref.shape != quant.shape or ref.dim() != 3 or tuple(ref.shape[:2]) != tuple(ids.shape):
            result.fail(
                f"[{name}] logits {tuple(ref.shape)} (quant {tuple(quant.shape)}) do not fit token ids "
                f"{tuple(ids.shape)}"
            )
            continue
        if not (torch.isfinite(ref).all() and torch.isfinite(quant).all()):
            result.fail(
                f"[{name}] non-finite logits: {int((~torch.isfinite(ref)).sum())} float, "
                f"{int((~torch.isfinite(quant)).sum())} quantized"
            )
            continue
        stats = sample_stats(ref, quant, ids, sample.valid_tokens)
        if stats["n"] == 0:
            result.fail(f"[{name}] no position predicts a valid next token")
            continue
        suffix = "" if name == "default" and len(pipeline.built.inputs.evaluation) == 1 else f"[{name}]"
        if suffix:
            for key, value in _metrics(stats).items():
                result.metrics[key + suffix] = value
        for key in ("n", "nll_float", "nll_quant", "kl", "agree"):
            pooled[key] += stats[key]
        pooled["kl_max"] = max(pooled["kl_max"], stats["kl_max"])
    if pooled["n"] == 0:
        if not result.problems:
            result.fail("no evaluation sample has a position that predicts a valid next token")
        return result
    metrics = _metrics(pooled)
    result.metrics.update(metrics)
    result.evidence["pooled"] = dict(metrics, samples=sorted(pipeline.built.inputs.evaluation))
    result.gate("perplexity ratio quant/float", metrics["ppl_ratio"], th.max_ppl_ratio)
    result.gate("top-1 agreement", metrics["top1_agreement"], th.min_top1_agreement, upper=False)
    result.gate("KL(float || quant) nats", metrics["kl_divergence"], th.max_kl_divergence)
    result.notes.append(
        f"{metrics['predicted_tokens']} predicted tokens: PPL float {metrics['ppl_float']:.4g}, "
        f"quant {metrics['ppl_quant']:.4g}; top-1 agreement {metrics['top1_agreement']:.4f}; "
        f"KL {metrics['kl_divergence']:.4g} nats"
    )
    return result


CHECK = Check(
    name="lm_quality",
    run=run,
    description=__doc__.splitlines()[0],
    applies=requires_capability("language_model"),
    settings=Settings,
    metrics=(
        Metric("ppl_ratio", label="PPL quant/float", limit="max_ppl_ratio", headline=True),
        Metric("top1_agreement", better="higher", label="top-1 agree", limit="min_top1_agreement", headline=True),
        Metric("kl_divergence", unit="nats", label="KL(float||quant)", limit="max_kl_divergence", headline=True),
        Metric("ppl_float", better=None, label="PPL float"),
        Metric("ppl_quant", label="PPL quant"),
        Metric("kl_divergence_max", better=None, unit="nats", label="max KL"),
        Metric("predicted_tokens", better=None, label="predicted tokens"),
    ),
    report="""{% set m = rec.get("metrics") or {} %}{% set t = rec.get("settings") or {} %}
<table class="limits"><tr><th>metric</th><th>value</th><th>limit</th></tr>
<tr><td>PPL float</td><td>{{ m.get("ppl_float") | num }}</td><td class="muted">not gated</td></tr>
<tr><td>PPL quant</td><td>{{ m.get("ppl_quant") | num }}</td><td class="muted">not gated</td></tr>
<tr><td>PPL quant / float</td><td>{{ m.get("ppl_ratio") | num }}</td><td>&le; {{ t.get("max_ppl_ratio") | num
}}</td></tr>
<tr><td>top-1 agreement</td><td>{{ m.get("top1_agreement") | num }}</td><td>&ge; {{ t.get("min_top1_agreement")
| num }}</td></tr>
<tr><td>KL(float || quant)</td><td>{{ m.get("kl_divergence") | num }}</td><td>&le; {{
t.get("max_kl_divergence") | num }}</td></tr>
<tr><td>predicted tokens</td><td>{{ m.get("predicted_tokens") | num }}</td><td></td></tr></table>""",
)
