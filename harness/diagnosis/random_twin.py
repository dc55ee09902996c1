"""A random-weight twin of a module: the same module, shapes and inputs, with every matrix weight
(nn.Linear, nn.Embedding) replaced by seeded iid normals. Contrasting a real-weights case with its
twin separates what the trained weights' *distributions* cause (outlier rows and channels) from what
the sizes alone cause.

The normals come from ``torch.rand`` through Box-Muller in float64, so they are the same under every
kernel selection (seeded ``torch.randn`` is not: DESIGN.md, "Seeded torch.randn is not portable").
Norm weights and biases are left as they are (a trained norm scale is not a "random weight").
"""

from __future__ import annotations

import math

import torch

DEFAULT_STD = 0.02  # Llama's initializer_range: what a freshly initialised model of this config holds


def portable_normal(shape: tuple[int, ...], std: float, seed: int) -> torch.Tensor:
    """iid N(0, std^2) float32 numbers that do not depend on the CPU's kernels."""
    if std <= 0:
        raise ValueError(f"std must be positive, got {std}")
    gen = torch.Generator().manual_seed(seed)
    u1 = torch.rand(shape, generator=gen, dtype=torch.float64).clamp_min(1e-300)
    u2 = torch.rand(shape, generator=gen, dtype=torch.float64)
    return (std * torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)).to(torch.float32)


def randomize_weights(module: torch.nn.Module, *, std: float = DEFAULT_STD, seed: int = 0) -> list[str]:
    """Replace, in place, every nn.Linear / nn.Embedding weight of ``module`` with portable iid
    normals of the same shape (a tied weight once); returns the names of the weights replaced."""
    done: set[int] = set()
    replaced = []
    with torch.no_grad():
        for index, (name, sub) in enumerate(module.named_modules()):
            if not isinstance(sub, (torch.nn.Linear, torch.nn.Embedding)) or id(sub.weight) in done:
                continue
            done.add(id(sub.weight))
            sub.weight.copy_(portable_normal(tuple(sub.weight.shape), std, seed + index))
            replaced.append(f"{name}.weight" if name else "weight")
    if not replaced:
        raise ValueError(f"{type(module).__name__} holds no nn.Linear / nn.Embedding weight to randomize")
    return replaced
