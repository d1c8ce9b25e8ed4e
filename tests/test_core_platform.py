"""Device and dtype detection, and what ``auto`` resolves to on machines we pretend to be."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY

from workbench.core import platform
from workbench.core.platform import DeviceReport
from workbench.errors import ConfigError

CUDA_BF16 = DeviceReport(type="cuda", name="Pretend H100", bf16=True, fp16=True, tf32=True, capability=(9, 0),
                         memory_total=80 * 2**30, memory_free=79 * 2**30, flash_attention=True,
                         efficient_attention=True)
CUDA_NO_BF16 = DeviceReport(type="cuda", name="Pretend V100", bf16=False, fp16=True, capability=(7, 0),
                            memory_total=16 * 2**30, memory_free=15 * 2**30, efficient_attention=True)
MPS = DeviceReport(type="mps", name="Apple MPS", bf16=False, fp16=True)
MACHINES = {"cpu": None, "cuda_bf16": CUDA_BF16, "cuda_no_bf16": CUDA_NO_BF16, "mps": MPS}


@pytest.fixture
def machine(monkeypatch):
    """``machine(name)`` makes the probes report that machine (a CPU, plus the named accelerator)."""

    def pretend(name: str):
        extra = MACHINES[name]
        monkeypatch.setattr(platform, "_cuda_available", lambda: extra is not None and extra.type == "cuda")
        monkeypatch.setattr(platform, "_mps_available", lambda: extra is not None and extra.type == "mps")
        monkeypatch.setattr(platform, "_probe_cuda", lambda: extra)
        monkeypatch.setattr(platform, "_probe_mps", lambda: extra)
        return platform.detect(refresh=True)

    yield pretend
    monkeypatch.undo()
    platform.detect(refresh=True)


DIFFUSERS = {"cpu": "float32", "cuda": "bfloat16"}
FALLBACK = {"cpu": "float32", "cuda": ("bfloat16", "float16"), "mps": "float16"}


@pytest.mark.parametrize("name, device, dtype, precision, expected", [
    ("cpu", "auto", "auto", DIFFUSERS, ("cpu", torch.float32)),
    ("cpu", "auto", "bfloat16", DIFFUSERS, ("cpu", torch.bfloat16)),  # asked for explicitly: honoured
    ("cuda_bf16", "auto", "auto", DIFFUSERS, ("cuda", torch.bfloat16)),
    ("cuda_bf16", "cpu", "auto", DIFFUSERS, ("cpu", torch.float32)),  # CUDA exists, the weights go to the CPU
    ("cuda_bf16", "auto", "auto", {"cpu": "float32"}, ("cuda", torch.float32)),  # the card names no cuda dtype
    ("cuda_no_bf16", "auto", "auto", DIFFUSERS, ("cuda", torch.float32)),
    ("cuda_no_bf16", "auto", "auto", FALLBACK, ("cuda", torch.float16)),
    ("cuda_no_bf16", "auto", "float16", DIFFUSERS, ("cuda", torch.float16)),
    ("mps", "auto", "auto", DIFFUSERS, ("mps", torch.float32)),
    ("mps", "auto", "auto", FALLBACK, ("mps", torch.float16)),
    ("mps", "cpu", "auto", FALLBACK, ("cpu", torch.float32)),
])
def test_auto_resolves_through_the_platform_and_the_cards_precision(machine, name, device, dtype, precision,
                                                                   expected):
    machine(name)
    target, weights = platform.placement(device, dtype, precision)
    assert (target.type, weights) == expected


@pytest.mark.parametrize("name, device, dtype, message", [
    ("cpu", "cuda", "auto", r"x.device: 'cuda' was requested but no CUDA device is visible to torch \(visible: cpu\)"
                            r"\. Use device: auto \(the best visible\) or cpu"),
    ("cuda_bf16", "mps", "auto", r"'mps' was requested but no MPS device is visible to torch \(visible: cuda, cpu\)"),
    ("cuda_bf16", "cuda:1", "auto",
     r"'cuda:1' was requested but 1 CUDA device\(s\) are visible \(cuda:0 \.\.\. cuda:0\)"),
    ("cpu", "gpu", "auto", r"unknown device 'gpu'; allowed: 'auto', 'cpu', 'cuda', 'mps'"),
    ("cuda_no_bf16", "auto", "bfloat16", r"x.dtype: bfloat16 was requested on Pretend V100, which does not support "
                                         r"it\. Use dtype: auto"),
    ("cpu", "auto", "fp16", r"x.dtype: unknown dtype 'fp16'; allowed: 'auto', 'bfloat16', 'float16', 'float32'"),
])
def test_impossible_requests_are_refused_with_the_fix(machine, name, device, dtype, message):
    machine(name)
    with pytest.raises(ConfigError, match=message):
        platform.placement(device, dtype, DIFFUSERS, where="x")


def test_detection_reports_the_kernels_and_memory(machine):
    found = machine("cuda_bf16")
    assert [d.type for d in found.devices] == ["cuda", "cpu"] and found.best is CUDA_BF16
    text = platform.report(found)
    assert ("  cuda  Pretend H100: dtypes float32, bfloat16, float16; memory 79.0 GiB free of 80.0 GiB; compute "
            "capability 9.0; x1; tf32 off; flash attention yes; memory-efficient attention yes") in text
    assert text.endswith("device: auto -> cuda")
    assert "dtypes float32, float16;" in platform.report(machine("cuda_no_bf16"))


def test_detection_is_cached_and_touches_no_cuda_at_import(monkeypatch):
    import subprocess
    import sys

    code = ("import sys, torch, workbench, workbench.core.platform as p; "
            "print(torch.cuda.is_initialized(), p._detected is None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
    calls = []
    monkeypatch.setattr(platform, "_cuda_available", lambda: calls.append(1) or False)
    first = platform.detect(refresh=True)
    assert platform.detect() is first and calls == [1]
    monkeypatch.undo()
    platform.detect(refresh=True)


def test_a_backbone_built_on_a_cpu_only_machine_is_float32_on_the_cpu(machine):
    from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig

    machine("cpu")
    base = TinyVideo(TinyVideoConfig(**TINY))
    assert (base.device.type, base.dtype) == ("cpu", torch.float32)
    assert {p.dtype for p in base.state_dict().values()} == {torch.float32}
    assert base.card.components["denoiser"].dtype == "float32"


def test_shipped_weights_load_straight_into_the_requested_dtype():
    from workbench.backbones.tiny_video import TinyVideo

    full = TinyVideo.from_pretrained()
    half = TinyVideo.from_pretrained(dtype="bfloat16")
    assert half.card.components["vae"].dtype == "bfloat16"
    ours, theirs = full.state_dict(), half.state_dict()
    assert ours.keys() == theirs.keys()
    for key, value in ours.items():
        assert theirs[key].device.type == "cpu" and theirs[key].dtype == torch.bfloat16, key
        assert torch.equal(theirs[key], value.to(torch.bfloat16)), key
    assert not any(p.requires_grad is False for p in half.parameters())  # built like any module: freezing is later
    video = torch.rand(1, 3, 16, 64, 64) * 2 - 1
    assert half.prepare_batch({"video": video}).latents.dtype == torch.bfloat16


def test_an_experiment_loads_its_base_on_the_training_device(machine, tmp_path):
    """With a CUDA device visible, training.device: cpu must put an ``auto`` base on the CPU, in float32."""
    from workbench.train.config import parse_experiment
    from workbench.train.experiment import AdapterExperiment

    machine("cuda_bf16")
    config = parse_experiment({"base": {"type": "tiny_video", "config": TINY},
                               "adapter": {"type": "latent_residual", "config": {"width": 16, "depth": 1}},
                               "training": {"device": "cpu", "progress": False}})
    exp = AdapterExperiment.from_config(config)
    assert exp.device == torch.device("cpu")
    assert (exp.model.base.device.type, exp.model.base.dtype) == ("cpu", torch.float32)
    assert exp.model.base.config.device == "cpu"
    assert exp.resolved_config()["base"]["config"] == TINY  # the saved config keeps what was asked for


def test_amp_in_a_dtype_the_device_lacks_is_refused(monkeypatch):
    from conftest import tiny_base

    from workbench.adapters.latent_residual import LatentResidual
    from workbench.train.config import TrainingConfig
    from workbench.train.experiment import AdapterExperiment

    monkeypatch.setattr(platform, "_probe_cpu", lambda: DeviceReport("cpu", "Pretend CPU", bf16=False, fp16=True))
    platform.detect(refresh=True)
    try:
        with pytest.raises(ConfigError, match=r"training.amp_dtype: bfloat16 was requested on Pretend CPU, which "
                                              r"does not support it"):
            AdapterExperiment(base=tiny_base(), adapter=LatentResidual(width=16, depth=1),
                              training=TrainingConfig(amp_dtype="bf16", device="cpu", progress=False))
    finally:
        monkeypatch.undo()
        platform.detect(refresh=True)


def test_doctor_prints_the_platform_and_what_auto_resolves_to(machine, capsys):
    from workbench.cli import main

    machine("cuda_no_bf16")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert ("  cuda  Pretend V100: dtypes float32, float16; memory 15.0 GiB free of 16.0 GiB; compute capability "
            "7.0") in out
    assert "\ndevice: auto -> cuda\n" in out
    assert ("dtype: auto on cuda takes the card's precision for cuda where the device supports it: float32 -> float32, "
            "bfloat16 -> float32, float16 -> float16") in out
    assert ("tiny_video -> float32; diffusers backbones (card precision {'cpu': 'float32', 'cuda': 'bfloat16'}) -> "
            "float32") in out
    machine("cpu")
    main(["doctor"])
    out = capsys.readouterr().out
    assert "\ndevice: auto -> cpu\n" in out and "  cpu   CPU (" in out and "cuda  " not in out


def test_the_cuda_probe_reads_torch_cuda(monkeypatch):
    """The probe itself, against a stubbed ``torch.cuda`` (the CPU build has no device to read)."""
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda, "get_device_capability", lambda index=0: (8, 0))
    monkeypatch.setattr(cuda, "mem_get_info", lambda index=0: (30 * 2**30, 40 * 2**30))
    monkeypatch.setattr(cuda, "get_device_name", lambda index=0: "Stub A100")
    monkeypatch.setattr(cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(cuda, "device_count", lambda: 2)
    found = platform._probe_cuda()
    assert (found.name, found.capability, found.bf16, found.tf32, found.count) == ("Stub A100", (8, 0), True, True, 2)
    assert (found.memory_free, found.memory_total) == (30 * 2**30, 40 * 2**30)
    assert found.flash_attention == torch.backends.cuda.flash_sdp_enabled()


def test_an_experiment_refuses_a_base_whose_auto_dtype_was_resolved_for_another_device():
    from conftest import tiny_base

    from workbench.adapters.latent_residual import LatentResidual
    from workbench.train.config import TrainingConfig
    from workbench.train.experiment import AdapterExperiment

    # stands in for bfloat16 weights loaded for a GPU (no GPU here: the meta device plays it)
    base = tiny_base().to(device="meta", dtype=torch.bfloat16)
    with pytest.raises(ConfigError, match=r"training.device is cpu, but the backbone was loaded on meta in bfloat16 "
                                          r"\(its dtype: auto, resolved for meta\); on cpu its card runs float32\. "
                                          r"Moving it would train in bfloat16 on cpu\. Build the backbone with "
                                          r"device: cpu"):
        AdapterExperiment(base=base, adapter=LatentResidual(width=16, depth=1),
                          training=TrainingConfig(device="cpu", progress=False))
    explicit = tiny_base(dtype="bfloat16")  # asked for: honoured, no refusal
    exp = AdapterExperiment(base=explicit, adapter=LatentResidual(width=16, depth=1),
                            training=TrainingConfig(device="cpu", progress=False))
    assert exp.model.base.dtype == torch.bfloat16


def test_a_backbone_config_names_a_device_or_auto():
    from workbench.config import build

    with pytest.raises(ConfigError, match=r"base.config.device: must be auto, cpu, cuda, cuda:N or mps, got 'gpu'"):
        build("backbone", "tiny_video", {**TINY, "device": "gpu"}, where="base")
    assert [platform.is_device_name(n) for n in ("auto", "cpu", "cuda", "cuda:1", "mps", "mps:0", "cuda:x")] == [
        True, True, True, True, True, False, False]


@pytest.mark.parametrize(("capability", "machine_name", "warns"), [
    ("AVX2", "x86_64", True), ("DEFAULT", "x86_64", True), ("NO AVX", "AMD64", True), ("AVX512", "x86_64", False),
    ("DEFAULT", "aarch64", False)])
def test_bf16_on_a_cpu_that_emulates_it_warns_once_per_process(monkeypatch, capability, machine_name, warns):
    import warnings

    from workbench.errors import SlowDtypeWarning

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(platform, "_machine", lambda: machine_name.lower())
    monkeypatch.setattr(platform, "_slow_dtype_warned", False)
    assert platform.cpu_bf16_is_emulated() is warns
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert platform.resolve_dtype("float32", "cpu") == torch.float32  # float32 never warns
        assert platform.resolve_dtype("bfloat16", "cpu") == torch.bfloat16  # honoured, warned about
        assert platform.resolve_dtype("bfloat16", "cpu") == torch.bfloat16  # once per process
        assert platform.resolve_dtype("auto", "cpu", precision={"cpu": "bfloat16"}) == torch.bfloat16
    slow = [w for w in seen if issubclass(w.category, SlowDtypeWarning)]
    assert len(slow) == (1 if warns else 0), [str(w.message) for w in seen]
    if warns:
        assert str(slow[0].message) == (
            f"bfloat16 on this CPU ({capability}, no AVX-512 or AMX) is emulated: it runs tens of times slower than "
            f"float32 (a 1024x1024 matmul about 80 times). Use dtype: auto or float32 on the CPU unless you are "
            f"checking the bfloat16 path. (Warned once per process.)")
        assert issubclass(SlowDtypeWarning, UserWarning)


def test_the_slow_dtype_warning_is_for_the_cpu_only(monkeypatch):
    import warnings

    from workbench.errors import SlowDtypeWarning

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(platform, "_machine", lambda: "x86_64")
    monkeypatch.setattr(platform, "_slow_dtype_warned", False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        platform._warn_slow_dtype(torch.bfloat16, "cuda")
        platform._warn_slow_dtype(torch.float16, "cpu")
    assert not [w for w in seen if issubclass(w.category, SlowDtypeWarning)]
    assert platform._slow_dtype_warned is False
