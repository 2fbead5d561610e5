"""PyTorch stages: a spec's ``framework = "torch"`` stage, wrapped into the lanes' ``fn(xp, inp, out)``.

The decisions this module protects:
- An array stage (``framework = "array"``) is the resolved function itself: the lanes call it as
  before, with no wrapper and no per-batch cost.
- A torch stage gets ``inp`` and ``out`` as tensors that share memory with the slot buffers
  (``torch.from_dlpack`` of the NumPy/CuPy views, never a copy), under ``torch.inference_mode()``,
  inside the backend's ``torch_stream()`` context: on NumPy nothing (the lane's compute thread), on
  CuPy the lane's compute stream as a ``torch.cuda.ExternalStream``.
- A ``factory`` is called once per lane, never per batch: on the lane's first batch, on its compute
  thread (inside the stream context, outside inference mode). Each lane has one compute thread for
  its whole life (``StreamSet``), so a thread-local cache is a per-lane cache; a new run's lanes
  call the factory again.
- torch is optional and imported only here (and by the spec check): an engine without torch stages
  never loads it.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from warpdeck.engine.edges.config import resolve_target
from warpdeck.engine.edges.step_spec import StageSpec

__all__ = ["Params", "TorchStage", "WithParams", "stage_fns", "takes_params", "torch_stage"]

StageFn = Callable[..., Any]
"""What the lanes call a stage with: ``fn(xp, inp, out)``."""


def _torch() -> Any:
    # Lazily, by name: the engine must load without torch, and mypy need not know its stubs.
    return importlib.import_module("torch")


class TorchStage:
    """One torch stage as the lanes call it: ``(xp, inp, out)`` becomes ``fn(model, inp, out)``
    with a factory, else ``fn(inp, out)``, on tensors that are the slot buffers themselves."""

    def __init__(self, fn: StageFn, factory: Callable[[], Any] | None,
                 stream: Callable[[], AbstractContextManager[Any]]) -> None:
        self._torch = _torch()
        self._fn = fn
        self._factory = factory
        self._stream = stream
        self._lane = threading.local()
        self.out_spec: Any = getattr(fn, "out_spec", None)
        """The wrapped function's ``out_spec`` (``plan_stages`` reads it from here)."""

    def _model(self) -> Any:
        assert self._factory is not None
        try:
            return self._lane.model
        except AttributeError:
            model = self._lane.model = self._factory()
            return model

    def __call__(self, xp: Any, inp: Any, out: Any) -> None:
        torch = self._torch
        with self._stream():
            t_in = torch.from_dlpack(inp)
            t_out = torch.from_dlpack(out)
            if self._factory is None:
                with torch.inference_mode():
                    self._fn(t_in, t_out)
                return
            model = self._model()
            with torch.inference_mode():
                self._fn(model, t_in, t_out)


def stage_fns(stages: Sequence[StageSpec], stream: Callable[[], AbstractContextManager[Any]],
              params: Params | None = None) -> tuple[StageFn, ...]:
    """The callables the lanes run for ``stages``: array stages as resolved, torch stages wrapped
    (``stream`` is the backend's ``torch_stream``). With ``params`` (a step after reduces: each
    reduce's result by its step's name), an array stage whose function takes a fourth parameter is
    called with them."""
    fns: list[StageFn] = []
    for st in stages:
        fn = resolve_target(st.fn)
        if st.framework == "torch":
            factory = resolve_target(st.factory) if st.factory is not None else None
            fn = TorchStage(fn, factory, stream)
        elif params is not None and takes_params(fn):
            fn = WithParams(fn, params)
        fns.append(fn)
    return tuple(fns)


_PARAMS_AT = 3
"""``params`` is a stage function's fourth positional parameter, after ``xp``, ``inp`` and ``out``."""

Params = Mapping[str, Mapping[str, Any]]
"""What a step's stages are given of the reduces before it: each one's result (names to arrays) by its step's name."""


def takes_params(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` has a fourth positional parameter without a default (``fn(xp, inp, out, params)``)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: called as fn(xp, inp, out)
        return False
    positional = [p for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) > _PARAMS_AT:
        return positional[_PARAMS_AT].default is inspect.Parameter.empty
    return any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values())


class WithParams:
    """An array stage called ``fn(xp, inp, out, params)``: the one wrapper a step after a reduce adds,
    for the functions that ask for the results."""

    def __init__(self, fn: StageFn, params: Params) -> None:
        self._fn = fn
        self._params = params
        self.out_spec: Any = getattr(fn, "out_spec", None)
        """The wrapped function's ``out_spec`` (``plan_stages`` reads it from here)."""

    def __call__(self, xp: Any, inp: Any, out: Any) -> None:
        self._fn(xp, inp, out, self._params)


class _Adapted:
    """``torch_stage``'s result: ``out.copy_(module(inp))``."""

    def __init__(self, module: Callable[[Any], Any], out_spec: Callable[..., Any] | None) -> None:
        self.module = module
        if out_spec is not None:
            self.out_spec = out_spec

    def __call__(self, inp: Any, out: Any) -> None:
        result = self.module(inp)
        if tuple(result.shape) != tuple(out.shape):  # copy_ would broadcast a smaller result silently
            raise ValueError(f"torch stage returned shape {tuple(result.shape)}, the stage's output is "
                             f"{tuple(out.shape)}: declare it with out_shape/out_dtype or out_spec")
        out.copy_(result)


def torch_stage(module: Callable[[Any], Any],
                out_spec: Callable[[tuple[int, ...], Any], tuple[tuple[int, ...], Any]] | None = None,
                ) -> Callable[[Any, Any], None]:
    """A torch stage (``framework = "torch"``, no factory) from an ``nn.Module`` or any callable
    from a tensor to a tensor: it writes ``module(inp)`` into ``out`` in place. An ``nn.Module``
    is put in eval mode. The output's per-task shape and dtype come from the stage's
    ``out_shape``/``out_dtype`` or from ``out_spec(shape, dtype) -> (shape, dtype)``; a result of
    another shape fails the batch. One module serves every lane: give the spec a ``factory``
    for a model per lane (per device)."""
    torch = _torch()
    if isinstance(module, torch.nn.Module):
        module.eval()
    return _Adapted(module, out_spec)
