"""Torch stages the torch tests name in specs (``wd_torch_stages:classify`` ...). Imports torch:
only tests/engine/test_torch_stages.py loads it, after checking that torch is there."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
from torch import nn

from warpdeck.engine.api import torch_stage

IN_SHAPE = (1, 8, 8)
"""Per-task input of the small model: one 8x8 channel; its output: 10 scores."""
OUT_SHAPE = (10,)

FACTORY_CALLS: list[str] = []
"""The compute thread of every ``make_model`` call (one per lane, never per batch)."""
TORCH_SEEN: list[tuple[int, int, bool, str]] = []
"""Per torch-stage call: (inp.data_ptr(), out.data_ptr(), inference mode on, compute thread)."""
NP_SEEN: list[tuple[int, int]] = []
"""Per ``np_addresses`` call: (input address, output address) of the NumPy views."""


def _seeded(module: nn.Module, seed: int) -> nn.Module:
    """Weights drawn from a generator of its own: the same model whichever thread builds it."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return module.eval()


def build_model() -> nn.Module:
    """Conv + linear, seeded."""
    return _seeded(nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                 nn.Linear(4 * 8 * 8, OUT_SHAPE[0])), seed=7)


def make_model() -> nn.Module:
    """The spec's factory: counts its calls by compute thread."""
    FACTORY_CALLS.append(threading.current_thread().name)
    return build_model()


def make_cuda_model() -> nn.Module:
    """The factory on a card: the model on the current CUDA device (built on the lane's compute stream)."""
    FACTORY_CALLS.append(threading.current_thread().name)
    return build_model().cuda()


def classify(model: nn.Module, inp: torch.Tensor, out: torch.Tensor) -> None:
    """out = model(inp), recording what the stage was given."""
    TORCH_SEEN.append((inp.data_ptr(), out.data_ptr(), torch.is_inference_mode_enabled(),
                       threading.current_thread().name))
    out.copy_(model(inp))


def np_addresses(xp: Any, inp: Any, out: Any) -> None:
    """An array stage: out = inp, recording the addresses of both NumPy views."""
    NP_SEEN.append((inp.__array_interface__["data"][0], out.__array_interface__["data"][0]))
    out[...] = inp


def scale_in_place(inp: torch.Tensor, out: torch.Tensor) -> None:
    """out = 3 * inp, written through ``out`` in place (the NumPy output must see it)."""
    TORCH_SEEN.append((inp.data_ptr(), out.data_ptr(), torch.is_inference_mode_enabled(),
                       threading.current_thread().name))
    torch.mul(inp, 3, out=out)


def boom(inp: torch.Tensor, out: torch.Tensor) -> None:
    """A torch stage that fails."""
    raise RuntimeError("torch stage exploded")


def _flat_spec(shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[tuple[int, ...], str]:
    return (3,), "float32"


SEQUENTIAL = _seeded(nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), seed=11)
"""The adapter over an nn.Sequential; its output declared through ``out_spec``."""
adapted = torch_stage(SEQUENTIAL, out_spec=_flat_spec)
