"""What this machine can run, and what ``device: auto`` / ``dtype: auto`` resolve to.

:func:`detect` reads the device once (CUDA, else Apple MPS, else the CPU) and what it supports:
bfloat16 and float16 compute, TF32 matmuls, free and total memory, and which scaled-dot-product
attention kernels (flash, memory-efficient) exist. It is pure torch and cheap; CUDA is touched
only when it is called, never at import.

``auto`` resolves in two steps:

* the device: :func:`resolve_device` — ``cuda`` if one is visible, else ``mps``, else ``cpu``;
* the dtype: :func:`resolve_dtype` — the backbone card's precision for that device type
  (``ModelCard.precision``, one dtype or a list in order of preference), the first entry the
  device supports, and float32 when none is.

So a backbone built on a CPU-only machine is float32 even if its card says bfloat16 on CUDA,
and one built for the CPU on a CUDA machine (``device: cpu``) is float32 there too. bfloat16 on a
CPU is honoured when asked for, but an x86 CPU without AVX-512 or AMX emulates it (a matmul 80
times slower than in float32 on an AVX2-only CPU): :func:`resolve_dtype` then warns once per
process with a :class:`~workbench.errors.SlowDtypeWarning`.

Examples:
    >>> placement("cpu", "auto", {"cpu": "float32", "cuda": "bfloat16"})
    (device(type='cpu'), torch.float32)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from workbench.errors import ConfigError, SlowDtypeWarning, did_you_mean, listing

DEVICE_TYPES = ("cpu", "cuda", "mps")
DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class DeviceReport:
    """One device and what it supports. Memory in bytes (``None``: not known for this device)."""

    type: str
    name: str
    bf16: bool
    fp16: bool
    tf32: bool = False
    tf32_enabled: bool = False
    capability: tuple[int, int] | None = None
    memory_total: int | None = None
    memory_free: int | None = None
    flash_attention: bool = False
    efficient_attention: bool = False
    count: int = 1

    def supports(self, dtype: str) -> bool:
        return dtype == "float32" or (dtype == "bfloat16" and self.bf16) or (dtype == "float16" and self.fp16)


@dataclass(frozen=True)
class Platform:
    """The devices torch can see here, best first, and the library versions that matter for them."""

    devices: tuple[DeviceReport, ...]
    torch_version: str
    cuda_version: str | None = None
    sdpa: bool = True

    @property
    def best(self) -> DeviceReport:
        return self.devices[0]

    def device(self, device_type: str) -> DeviceReport | None:
        return next((d for d in self.devices if d.type == device_type), None)


# -- probes (small functions, so tests can pretend to be any machine) --------------------------
def _cuda_available() -> bool:
    return torch.cuda.is_available()


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def _probe_cuda() -> DeviceReport:
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    free, total = torch.cuda.mem_get_info(index)
    sdp = torch.backends.cuda
    return DeviceReport(
        type="cuda", name=torch.cuda.get_device_name(index), bf16=torch.cuda.is_bf16_supported(), fp16=True,
        tf32=major >= 8, tf32_enabled=bool(torch.backends.cuda.matmul.allow_tf32), capability=(major, minor),
        memory_total=int(total), memory_free=int(free),
        flash_attention=major >= 8 and sdp.flash_sdp_enabled(),
        efficient_attention=sdp.mem_efficient_sdp_enabled(),
        count=torch.cuda.device_count(),
    )


def _probe_mps() -> DeviceReport:
    total = getattr(torch.mps, "recommended_max_memory", None)
    newer = getattr(torch.backends.mps, "is_macos_or_newer", None)
    bf16 = bool(callable(newer) and newer(14, 0))  # MPS computes in bfloat16 from macOS 14 on
    return DeviceReport(type="mps", name="Apple MPS", bf16=bf16, fp16=True,
                        memory_total=int(total()) if callable(total) else None)


def _probe_cpu() -> DeviceReport:
    import contextlib
    import os

    total = free = None
    with contextlib.suppress(AttributeError, OSError, ValueError):  # not a POSIX system: unknown
        page = os.sysconf("SC_PAGE_SIZE")
        total, free = page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    # bf16 and fp16 run on any CPU torch supports, slowly on most: only an explicit request uses them.
    return DeviceReport(type="cpu", name=f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)",
                        bf16=True, fp16=True, memory_total=total, memory_free=free)


_detected: Platform | None = None


def detect(refresh: bool = False) -> Platform:
    """The :class:`Platform` of this process (computed once; ``refresh=True`` probes again)."""
    global _detected
    if _detected is None or refresh:
        devices = []
        if _cuda_available():
            devices.append(_probe_cuda())
        if _mps_available():
            devices.append(_probe_mps())
        devices.append(_probe_cpu())
        _detected = Platform(tuple(devices), torch_version=torch.__version__, cuda_version=torch.version.cuda,
                             sdpa=hasattr(torch.nn.functional, "scaled_dot_product_attention"))
    return _detected


# -- bfloat16 on the CPU ---------------------------------------------------------------------
#: ``torch.backends.cpu.get_cpu_capability()`` values of an x86 CPU whose kernels emulate bfloat16.
EMULATED_BF16_CAPABILITIES = ("AVX2", "DEFAULT", "NO AVX")
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")
_slow_dtype_warned = False


def _cpu_capability() -> str:
    return torch.backends.cpu.get_cpu_capability()


def _machine() -> str:
    import platform

    return platform.machine().lower()


def cpu_bf16_is_emulated() -> bool:
    """True on an x86 CPU whose kernels compute bfloat16 by emulation: torch's CPU capability is below
    AVX-512.

    The capability torch runs at, not the hardware's: ``ATEN_CPU_CAPABILITY=avx2`` on an AVX-512 CPU
    (with ``ONEDNN_MAX_CPU_ISA=AVX2``) runs the AVX2 kernels, and is as slow in bfloat16 as an AVX2 CPU.
    """
    return _machine() in _X86 and _cpu_capability() in EMULATED_BF16_CAPABILITIES


def _warn_slow_dtype(dtype: torch.dtype, device_type: str) -> None:
    """Warn once per process when bfloat16 is resolved for a CPU that emulates it."""
    global _slow_dtype_warned
    if _slow_dtype_warned or dtype != torch.bfloat16 or device_type != "cpu" or not cpu_bf16_is_emulated():
        return
    _slow_dtype_warned = True
    import warnings

    warnings.warn(f"bfloat16 on this CPU ({_cpu_capability()}, no AVX-512 or AMX) is emulated: "
                  f"it runs tens of times slower than float32 (a 1024x1024 matmul about 80 times). "
                  f"Use dtype: auto or float32 on the CPU unless you are checking the bfloat16 path. "
                  f"(Warned once per process.)", SlowDtypeWarning,
                  stacklevel=3)


# -- resolution ------------------------------------------------------------------------------
def is_device_name(name: str) -> bool:
    """``auto``, ``cpu``, ``mps``, ``cuda`` or ``cuda:N`` (for a config's ``__post_init__``)."""
    kind, _, index = str(name).partition(":")
    return name == "auto" or (kind in DEVICE_TYPES and (not index or (kind == "cuda" and index.isdigit())))


def resolve_device(name: str | torch.device = "auto", *, where: str = "device") -> torch.device:
    """``auto`` → the best visible device (cuda, mps, cpu); an explicit one is checked to exist.

    ``where`` names the config field in the error (e.g. ``training.device``).
    """
    if isinstance(name, torch.device):
        name = str(name)
    if name == "auto":
        return torch.device(detect().best.type)
    kind = name.split(":")[0]
    if kind not in DEVICE_TYPES:
        raise ConfigError(f"{where}: unknown device {name!r}; allowed: 'auto', {listing(DEVICE_TYPES)} "
                          f"(cuda may carry an index, e.g. 'cuda:1').{did_you_mean(kind, DEVICE_TYPES)}")
    report = detect().device(kind)
    if report is None:
        seen = ", ".join(d.type for d in detect().devices)
        raise ConfigError(f"{where}: {name!r} was requested but no {kind.upper()} device is visible to torch "
                          f"(visible: {seen}). Use device: auto (the best visible) or cpu; "
                          f"`workbench doctor` shows what this machine has.")
    if kind == "cuda" and ":" in name and int(name.split(":")[1]) >= report.count:
        raise ConfigError(f"{where}: {name!r} was requested but {report.count} CUDA device(s) are visible "
                          f"(cuda:0 ... cuda:{report.count - 1}). Pick one of those or use device: auto.")
    return torch.device(name)


def preferences(precision: Mapping[str, str | Sequence[str]] | None, device_type: str) -> tuple[str, ...]:
    """A card's dtype preference for ``device_type``, best first (float32 when it names none)."""
    value = (precision or {}).get(device_type, "float32")
    return (value,) if isinstance(value, str) else tuple(value)


def resolve_dtype(name: str | torch.dtype = "auto", device: str | torch.device = "cpu", *,
                  precision: Mapping[str, str | Sequence[str]] | None = None,
                  where: str = "dtype") -> torch.dtype:
    """``auto`` → the first dtype of the card's ``precision[device type]`` the device supports.

    An explicit dtype is honoured if the device can compute in it (bfloat16 on a CUDA device
    without it is refused, with the fix).
    """
    if isinstance(name, torch.dtype):
        name = str(name).replace("torch.", "")
    device_type = torch.device(device).type
    report = detect().device(device_type) or _probe_cpu()
    if name == "auto":
        for choice in preferences(precision, device_type):
            if report.supports(choice):
                _warn_slow_dtype(DTYPE_NAMES[choice], device_type)
                return DTYPE_NAMES[choice]
        return torch.float32
    if name not in DTYPE_NAMES:
        raise ConfigError(f"{where}: unknown dtype {name!r}; allowed: 'auto', {listing(DTYPE_NAMES)}."
                          f"{did_you_mean(name, DTYPE_NAMES)}")
    if not report.supports(name):
        raise ConfigError(f"{where}: {name} was requested on {report.name}, which does not support it. "
                          f"Use dtype: auto (the card's choice among what this device supports) or float32.")
    _warn_slow_dtype(DTYPE_NAMES[name], device_type)
    return DTYPE_NAMES[name]


def placement(device: str | torch.device = "auto", dtype: str | torch.dtype = "auto",
              precision: Mapping[str, str | Sequence[str]] | None = None, *,
              where: str = "config") -> tuple[torch.device, torch.dtype]:
    """The device and dtype a backbone's weights load onto: the device first, the dtype for it."""
    target = resolve_device(device, where=f"{where}.device")
    return target, resolve_dtype(dtype, target, precision=precision, where=f"{where}.dtype")


def _gib(value: int | None) -> str:
    return "unknown" if value is None else f"{value / 2**30:.1f} GiB"


def report(platform: Platform | None = None) -> str:
    """A human-readable summary of :func:`detect` (what ``workbench doctor`` prints)."""
    p = platform or detect()
    lines = [f"torch {p.torch_version}  cuda {p.cuda_version or '(none)'}  "
             f"scaled_dot_product_attention {'yes' if p.sdpa else 'no'}"]
    for d in p.devices:
        dtypes = ", ".join(n for n in DTYPE_NAMES if d.supports(n))
        line = (f"  {d.type:<5} {d.name}: dtypes {dtypes}; "
                f"memory {_gib(d.memory_free)} free of {_gib(d.memory_total)}")
        if d.type == "cuda":
            line += (f"; compute capability {d.capability[0]}.{d.capability[1]}; x{d.count}; "
                     f"tf32 {'on' if d.tf32_enabled else 'off'}{'' if d.tf32 else ' (not supported)'}; "
                     f"flash attention {'yes' if d.flash_attention else 'no'}; "
                     f"memory-efficient attention {'yes' if d.efficient_attention else 'no'}")
        lines.append(line)
    best = p.best
    lines.append(f"device: auto -> {best.type}")
    return "\n".join(lines)
