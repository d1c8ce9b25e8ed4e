"""A backbone's denoiser run through ``torch.compile`` (see :meth:`BaseVideoModel.compile`).

The network every prediction runs through (the root of the backbone's
:class:`~workbench.core.inside.InsideSpec`: tiny_video's denoiser, a DiT's transformer, a U-Net)
gets a compiled ``forward``; the module itself is unchanged (same object, same parameter
names, same ``state_dict``). Three choices make the workbench's instruments keep working:

* **The forward is compiled, not the module's call.** ``nn.Module.compile()`` compiles
  ``__call__``, which also calls whatever ``forward`` is installed at the time (a diffusers
  backbone's sampler swaps in its injection there for the length of a ``generate``); compiling
  the network's own ``forward`` keeps that injection (the composition, recording, forks) out of
  the graph, and the base call it makes inside the graph. ``torch.compile(module)`` would wrap
  the module in another one (``_orig_mod.`` in every parameter name) and is not used either.
* **Hooks are guarded.** Forward hooks on the network's blocks (``action_modulation``,
  ``controlnet``) run inside the compiled forward. Dynamo does not guard on a module's hooks by
  default (``skip_nnmodule_hook_guards``): a hook added after the first call would silently be
  left out. The compiled forward runs with those guards on, so adding or removing a hook
  compiles once more, and a graph made for a set of hooks is reused whenever that set is back.
* **Shapes are static** (``dynamic=False``): each input shape (sampling batch, training batch,
  a guidance half) compiles once. An inside adapter switched on and off (recording with
  ``with_adapter=False``, a fork, an ablation) flips Python flags the hooks and peft's LoRA layers
  read: each state compiles once and is reused, never once per step. Up to
  :data:`RECOMPILE_LIMIT` variants per network are compiled; past that dynamo runs the new
  ones eagerly (same numbers, no speed-up).

:func:`compile_stats` counts what dynamo compiled in this process, for benchmarks and tests.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

MARK = "__workbench_compiled__"  # on the compiled forward's function: the options it was compiled with

RECOMPILE_LIMIT = 32
"""How many variants (shapes, grad mode, adapter states, hook sets) of a compiled network dynamo
compiles before running further ones eagerly (dynamo's own default is 8)."""


def compiled_options(net: nn.Module) -> dict[str, Any] | None:
    """The options ``net``'s forward was compiled with by :func:`compile_network`, or ``None`` (eager)."""
    forward = net.__dict__.get("forward")
    return getattr(getattr(forward, "__func__", None), MARK, None)


def compile_network(net: nn.Module, *, backend: str = "inductor", mode: str | None = None,
                    fullgraph: bool = False, options: Mapping[str, Any] | None = None) -> bool:
    """Give ``net`` a ``torch.compile``-d forward (static shapes, hooks guarded; see the module docstring).

    Returns ``False`` when it already has one (nothing changes), ``True`` otherwise.
    """
    if compiled_options(net) is not None:
        return False
    own = net.__dict__.get("forward")
    function = own.__func__ if isinstance(own, types.MethodType) else type(net).forward
    compiled = torch.compile(function, backend=backend, mode=mode, fullgraph=fullgraph, dynamic=False,
                             options=dict(options) if options else None)
    config = torch._dynamo.config

    def forward(self, *args, **kwargs):
        # contiguous tensors: a timestep expanded from a scalar (stride 0) and the same one made by
        # hand would otherwise compile twice (static shapes guard strides too)
        args = tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args)
        kwargs = {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        saved = config.skip_nnmodule_hook_guards, config.recompile_limit
        config.skip_nnmodule_hook_guards = False
        config.recompile_limit = max(saved[1], RECOMPILE_LIMIT)
        try:
            return compiled(self, *args, **kwargs)
        finally:
            config.skip_nnmodule_hook_guards, config.recompile_limit = saved

    setattr(forward, MARK, {"backend": backend, "mode": mode, "fullgraph": fullgraph, "dynamic": False,
                            "options": dict(options or {})})
    forward.__doc__ = function.__doc__
    # an instance attribute: the class and its state dict unchanged
    net.forward = types.MethodType(forward, net)
    return True


def compile_stats() -> dict[str, int]:
    """What ``torch.compile`` has done in this process so far: ``graphs`` (graphs compiled: the first
    compile and every recompilation) and ``frames`` (frames dynamo converted). Take the difference
    between two calls to count the compilations in between."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]), "frames": int(counters["frames"]["ok"])}


__all__ = ["RECOMPILE_LIMIT", "compile_network", "compile_stats", "compiled_options"]
