"""Every benchmark runs in its quick mode (``--quick``: one round, reduced loops, nothing judged), so none
can rot unnoticed; ``make bench`` runs them in full and judges their ratios. Nothing here asserts on time:
each test checks that the benchmark ran to the end, printed what it measures and exited 0.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from conftest import kept, requires_plugins

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

# benchmark -> lines its output must hold (the quantities it reports)
CASES = {
    "ablation_cache": ["speed-up from the base cache = "],
    "autoencoder_speed": ["sliced == one call, bit for bit: True", "ratio decode, slices / decode, one call = ",
                          "ratio encode, slices / encode, one call = "],
    "compose_overhead": ["ratio ComposedModel.predict / hand-written = ", "(target <= 1.05)"],
    "fork_speed": ["fork at  5 / full = ", "fork at 15 / full = "],
    "rollout_batching": ["the same frames in batches of 6 and 5: True; and alone: True",
                         "one episode per call / one call = ", "micro-batch 4 / one call = "],
    "preview_overhead": ["preview every step / no preview = "],
    "record_overhead": ["record / generate = ", "record(float16, every 4th step) / generate = "],
    "tiny_preview": ["gain of the tiny preview over the linear one, dB = ", "tiny / full decode = "],
    "inside_overhead": ["inside_overhead[lora]", "inside_overhead[action_modulation]", "inside_overhead[controlnet]"],
    "train_overhead": ["train_overhead (tiny)", "train_overhead (bench)", "train_overhead (loop only)",
                       "train_overhead (fixed cost, the model's work stubbed)",
                       "exp.fit's fixed cost per step (us) = "],
    "data_throughput": ["ratio lerobot / hdf5 time per batch = ", "data time / step time, lerobot"],
    "ddp_overhead": ["ratio 2 ranks / single = "],
    "closed_loop_speed": ["closed loop == hand loop, bit for bit (the last frames of 2 episodes): True",
                          " chunks per CPU-second", "closed loop / hand loop = "],
    "drive_latency": ["Drive key press,  8 sampling steps: ", "Drive key press at 8 steps, CPU seconds = ",
                      "load average "],
    "widget_latency": ["ablation slider move: ", "stepper (full decode, 3 branches)", "browser: not in --quick mode"],
    "compile_speed": ["compiled / eager sampling = ", "compiled / eager fit step = ", "recompilations: 0 during the "
                      "timed rounds, 0 while forks switched the adapter"],
    "integrity_overhead": ["embedded world model: save (CPU time)", "ratio save with digests / save plain = ",
                           "32 MB trainable state: load (CPU time)"],
}
PLUGIN_CASES = {
    "plugin_overhead": ["generate / pipeline = ", "record / pipeline = ", " us per step",
                        "wider transformer: generate / pipeline = ", "dynamicrafter record / sampler = "],
    "gpu_check": ["flow_matching on cpu: parity", "diffusion on cpu: parity",
                  *(kept(backbone, "cpu float32") for backbone in ("tiny_video", "wan22_ti2v", "easyanimate",
                                                                    "dynamicrafter")),
                  "gpu_check: every claim holds"],
    "real_size": ["== dynamicrafter", "== wan22", "== easyanimate", "LoRA injected / targeted",
                  "real_size: results in"],
}
# Every case runs the benchmark's default path (what `make bench` runs), quick-sized: gpu_check's default checks
# every backbone with its own example batch. Its GPU-precision path has a case of its own below.


def run(name: str, capsys, monkeypatch, tmp_path, args: tuple[str, ...] = ()) -> str:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    module = importlib.import_module(name)
    status = module.main(["--quick", *args])
    out = capsys.readouterr().out
    assert status == 0, out[-3000:]
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_each_benchmark_runs_in_its_quick_mode(name, capsys, monkeypatch, tmp_path):
    out = run(name, capsys, monkeypatch, tmp_path)
    missing = [line for line in CASES[name] if line not in out]
    assert missing == [], out[-3000:]


@requires_plugins
@pytest.mark.parametrize("name", list(PLUGIN_CASES))
def test_each_plugin_benchmark_runs_in_its_quick_mode(name, capsys, monkeypatch, tmp_path):
    out = run(name, capsys, monkeypatch, tmp_path)
    missing = [line for line in PLUGIN_CASES[name] if line not in out]
    assert missing == [], out[-3000:]


@requires_plugins
def test_gpu_check_runs_a_plugin_in_its_gpu_precision(capsys, monkeypatch, tmp_path):
    out = run("gpu_check", capsys, monkeypatch, tmp_path, ("--backbones", "dynamicrafter", "--dtype", "gpu"))
    assert kept("dynamicrafter", "cpu bfloat16") in out, out[-3000:]


def test_every_benchmark_has_a_quick_case():
    names = {p.stem for p in BENCHMARKS.glob("[!_]*.py")}
    assert names == set(CASES) | set(PLUGIN_CASES)


def test_a_missed_target_is_reported_and_fails_the_run_after_everything_printed(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    bench = importlib.import_module("_bench")
    bench.start([])
    assert bench.judge("a / b", 1.20, 1.05) is False and bench.judge("c / d", 0.99, 1.05) is True
    assert bench.judge("gain, dB", 7.0, 6.0, at_most=False, fmt="+.1f") is True
    assert bench.finish() == 1
    out = capsys.readouterr().out
    assert "a / b = 1.200 (target <= 1.05)  SHORT of its target" in out and "c / d = 0.990 (target <= 1.05)  ok" in out
    assert "gain, dB = +7.0 (target >= 6.00)  ok" in out and "1 of 3 targets missed: a / b = 1.200" in out
    bench.start(["--quick"])
    bench.judge("a / b", 1.20, 1.05)
    assert bench.finish() == 0 and "SHORT" not in capsys.readouterr().out  # quick mode judges nothing
    sys.modules.pop("_bench", None)
