"""A backbone's real architecture with random weights: built on the meta device, materialised once.

Rehearsing an instrument at a model's real size needs its architecture, not its weights. Building
a 5-billion-parameter module the usual way allocates and initialises every tensor in float32 and
then casts it — twice the bf16 bytes at the peak, and minutes of CPU. Here the parameters are
created on the meta device (no memory) while the buffers are computed as usual (rotary tables and
the like are small and come from the constructor), and :func:`materialise` then gives each
parameter its storage **once**, in its final dtype, filled with deterministic values:

* norm layers' weights 1 and biases 0 (a random scale would change the network's statistics);
* every other tensor uniform in ``±1/sqrt(fan_in)`` (``fan_in``: the elements of one output row),
  vectors and scalars in ``±0.02``; each tensor drawn from its own generator, seeded from
  ``seed`` and its name, so a parameter's values do not depend on the order or device of the build.

:func:`weights_on_meta` makes the random-weight builds of the plugins leave their parameters on
the meta device (sizes and shapes without memory): what ``workbench plan`` uses to size a model.

Examples:
    >>> with empty_parameters():
    ...     model = torch.nn.Linear(64, 64)            # parameters on meta, buffers real
    >>> model.weight.is_meta
    True
    >>> model = materialise(model, dtype=torch.bfloat16)   # one bf16 copy, deterministic values
    >>> model.weight.dtype, model.weight.is_meta
    (torch.bfloat16, False)
"""

from __future__ import annotations

import contextvars
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

_KEEP_META = contextvars.ContextVar("workbench_weights_on_meta", default=False)


@contextmanager
def weights_on_meta() -> Iterator[None]:
    """Random-weight builds inside this block keep their parameters on the meta device (no memory)."""
    token = _KEEP_META.set(True)
    try:
        yield
    finally:
        _KEEP_META.reset(token)


def keeping_meta() -> bool:
    """Whether random-weight builds should leave their parameters on the meta device (see
    :func:`weights_on_meta`)."""
    return _KEEP_META.get()


@contextmanager
def empty_parameters() -> Iterator[None]:
    """Every parameter registered inside this block is moved to the meta device as it is registered.

    Buffers are made as the constructor makes them (on its device), so tables computed in
    ``__init__`` survive; the parameters' initialisers run on meta tensors (no work). A parameter
    allocated by its constructor lives only until it is registered (one tensor at a time).
    """
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.detach().to("meta"),
                                                    requires_grad=param.requires_grad)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


NORM_TYPES = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def is_norm(module: nn.Module) -> bool:
    """A normalisation layer (torch's, or any class whose name says ``Norm``)."""
    return isinstance(module, NORM_TYPES) or "norm" in type(module).__name__.lower()


def fill(tensor: torch.Tensor, name: str, owner: nn.Module, seed: int = 0) -> torch.Tensor:
    """Fill ``tensor`` (on the CPU) in place with the deterministic random values of parameter ``name``."""
    leaf = name.rsplit(".", 1)[-1]
    if is_norm(owner) and tensor.ndim <= 1 and leaf in ("weight", "bias", "scale", "gamma", "beta"):
        return tensor.fill_(1.0 if leaf in ("weight", "scale", "gamma") else 0.0)
    generator = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    if tensor.ndim >= 2:
        bound = (tensor.numel() // tensor.shape[0]) ** -0.5
    else:
        bound = 0.02
    return tensor.uniform_(-bound, bound, generator=generator)


def materialise(module: nn.Module, *, dtype: torch.dtype, device: str | torch.device = "cpu", seed: int = 0,
                float32: Callable[[str], bool] | Iterable[str] = ()) -> nn.Module:
    """Give every meta parameter of ``module`` its storage once, in ``dtype`` on ``device``, filled by
    :func:`fill`.

    ``float32``: parameter names (or a predicate on them) kept in float32 whatever ``dtype``. Each
    tensor is filled on the CPU and moved on its own, so the peak is the weights plus one tensor.
    A parameter shared by several modules stays shared. ``device="meta"``: the parameters get their
    dtype and no storage (sizes for a memory plan). Buffers are left as they are, except that
    buffers still on the meta device are an error (the constructor made them there). Returns ``module``.
    """
    keep = float32 if callable(float32) else set(float32).__contains__
    device = torch.device(device)
    made: dict[int, nn.Parameter] = {}
    for prefix, owner in module.named_modules(remove_duplicate=False):
        for leaf, param in list(owner._parameters.items()):
            if param is None or param.device.type != "meta":
                continue
            if id(param) in made:
                owner._parameters[leaf] = made[id(param)]
                continue
            name = f"{prefix}.{leaf}" if prefix else leaf
            want = torch.float32 if keep(name) else dtype
            if device.type == "meta":  # sizes only (a memory plan): the right dtype, no storage
                data = torch.empty(param.shape, dtype=want, device="meta")
            else:
                data = torch.empty(param.shape, dtype=want)
                if want.is_floating_point:
                    fill(data, name, owner, seed)
                else:
                    data.zero_()
                data = data.to(device)
            made[id(param)] = owner._parameters[leaf] = nn.Parameter(data, requires_grad=param.requires_grad)
    stale = [name for name, b in module.named_buffers() if b.device.type == "meta"]
    if stale and device.type != "meta":
        raise RuntimeError(f"materialise: buffers {stale[:5]} are on the meta device; build the module "
                           f"inside empty_parameters() (parameters on meta, buffers real), "
                           f"not under torch.device('meta').")
    return module


def parameter_bytes(module: nn.Module) -> int:
    """Bytes of ``module``'s parameters and buffers (meta tensors included: their sizes, not their memory)."""
    seen: set[int] = set()
    total = 0
    for tensor in (*module.parameters(), *module.buffers()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


__all__ = ["empty_parameters", "fill", "is_norm", "keeping_meta", "materialise", "parameter_bytes",
           "weights_on_meta"]
