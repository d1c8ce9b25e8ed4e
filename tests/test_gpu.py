"""The GPU path: ``pytest -m gpu`` on a machine with CUDA (without one these skip, saying why).

The conformance kit in bfloat16 on CUDA (identity, recording, a fork, two fit steps, ...) for
tiny_video and the tiny plugin pipelines; a short mixed-precision fit, a recorded sample and a
fork through the experiment API. ``benchmarks/gpu_check.py`` refuses loudly to pretend.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY, requires_plugins

from workbench import AdapterExperiment, GatedResidual, TrainingConfig
from workbench.adapters.latent_residual import LatentResidual
from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig
from workbench.config import build
from workbench.testing import check_backbone

ROOT = Path(__file__).resolve().parents[1]
requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device is visible: the GPU path runs with `pytest -m gpu` on a machine with one")


def tiny_raw() -> dict:
    """Every input tiny_video takes: its own example batch."""
    return make_tiny().example_batch()


def make_tiny(objective: str = "flow_matching"):
    torch.manual_seed(0)
    return TinyVideo(TinyVideoConfig(**{**TINY, "objective": objective}))


def check_tiny_video(device: str, dtype: torch.dtype, objective: str):
    return check_backbone(lambda: make_tiny(objective), raw=tiny_raw(), device=device, dtype=dtype,
                          adapter_factory=lambda: LatentResidual(width=16, depth=1))


def fit_sample_fork(device: str, amp_dtype: str | None):
    """A few fit steps, a recorded sample and a fork, the way a notebook runs them."""
    exp = AdapterExperiment(base=make_tiny(), adapter=LatentResidual(width=16, depth=1),
                            composer=GatedResidual(gate_init=0.5),
                            training=TrainingConfig(batch_size=2, learning_rate=1e-2, progress=False, device=device,
                                                    amp_dtype=amp_dtype, sync_every=2))
    raw = tiny_raw()
    exp.fit([raw] * 3, steps=3)
    traj = exp.sample(raw, steps=4, seed=1)
    plain = exp.model.generate(exp.prepare(raw), steps=4, generator=torch.Generator(device=device).manual_seed(1))
    fork = traj.fork(at=2)
    return exp, traj, plain, fork


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("objective", ["flow_matching", "diffusion"])
def test_tiny_video_keeps_the_contract_on_cuda_in_bfloat16(objective):
    report = check_tiny_video("cuda", torch.bfloat16, objective)
    assert report.ok and report.setting == "cuda bfloat16"


@pytest.mark.gpu
@requires_cuda
def test_a_mixed_precision_fit_records_and_forks_on_cuda():
    exp, traj, plain, fork = fit_sample_fork("cuda", "bf16")
    assert exp.step == 3 and all(torch.isfinite(torch.tensor(exp.loss_history)))
    assert next(exp.model.adapter.parameters()).device.type == "cuda"
    assert torch.equal(traj.final, plain.cpu())
    assert torch.equal(fork[2].x_t, traj[2].x_t) and torch.equal(fork.final, traj.final)


PLUGINS = [("wan22_ti2v", "wan22_latent_residual", 48), ("easyanimate", "easyanimate_latent_residual", 4)]


@pytest.mark.gpu
@requires_cuda
@requires_plugins
@pytest.mark.parametrize(("backbone", "adapter", "channels"), PLUGINS, ids=[p[0] for p in PLUGINS])
def test_the_tiny_plugins_keep_the_contract_on_cuda_in_bfloat16(backbone, adapter, channels, tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    base = build("backbone", backbone, {"path": "tiny", "dtype": "bfloat16", "height": 64, "width": 64,
                                        "num_frames": 9, "steps": 4, "prompt": "a robot arm pushes a puck"})
    g = torch.Generator().manual_seed(0)
    raw = {"video": torch.rand(2, 3, 9, 64, 64, generator=g) * 2 - 1, "action": torch.rand(2, 9, 4, generator=g),
           "proprio": torch.rand(2, 9, 3, generator=g), "ee_pos": torch.rand(2, 9, 3, generator=g),
           "control": torch.rand(2, 1, 9, 64, 64, generator=g), "prompt": "a robot arm pushes a puck"}
    negative = base.encode_text(["", ""])
    keys = ("negative_prompt_embeds", "negative_prompt_attention_mask")
    raw.update(zip(keys, negative) if isinstance(negative, tuple) else [(keys[0], negative)])
    report = check_backbone(base, raw=raw, device="cuda", steps=4,  # the card's precision: bf16 transformer
                            adapter_factory=lambda: build("adapter", adapter, {"channels": channels, "width": 16,
                                                                               "depth": 1}))
    assert report.ok and base.transformer.dtype == torch.bfloat16


@pytest.mark.gpu
@requires_cuda
@requires_plugins
def test_gpu_check_holds_on_cuda_for_every_backbone_in_its_cards_gpu_precision(tmp_path):
    """``gpu_check.py --device cuda --dtype gpu``: parity, forks and previews on CUDA, and the conformance kit on
    tiny_video and each plugin's tiny model in its card's GPU precision (bf16; DynamiCrafter's float32 norms)."""
    out = subprocess.run([sys.executable, "gpu_check.py", "--device", "cuda", "--dtype", "gpu", "--quick"],
                         cwd=ROOT / "benchmarks", capture_output=True, text=True,
                         env={**os.environ, "WORKBENCH_CACHE": str(tmp_path)})
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "DynamiCrafter (dynamicrafter-512:tiny random model) on cuda bfloat16: all 15 promises kept" in out.stdout
    assert "gpu_check: every claim holds" in out.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: nothing to refuse")
def test_gpu_check_refuses_loudly_when_cuda_is_asked_for_and_absent():
    out = subprocess.run([sys.executable, "gpu_check.py", "--device", "cuda"], cwd=ROOT / "benchmarks",
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "gpu_check: FAILED: --device cuda was asked for, but no CUDA device is visible" in out.stderr
    assert "--device cpu runs the same checks on the CPU" in out.stderr
