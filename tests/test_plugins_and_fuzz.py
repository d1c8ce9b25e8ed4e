"""Entry-point plugins resolve from installed distribution metadata only; the config loader,
fuzzed, only ever raises the project's own ConfigError."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.errors import ConfigError
from workbench.train.config import parse_experiment

FIXTURE = Path(__file__).parent / "fixtures" / "workbench-fixture-plugin"

RESOLVE = """
import sys
sys.path.insert(0, {path!r})
from workbench.config import build
from workbench.registry import registered
from workbench.errors import UnknownComponentError
try:
    adapter = build("adapter", "fixture_bias", {{"channels": 4}})
    print("resolved", type(adapter).__module__, type(adapter).__name__, "fixture_bias" in registered("adapter"))
except UnknownComponentError as err:
    print("unknown", str(err).replace("\\n", " | "))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    import shutil

    source = tmp_path_factory.mktemp("src") / FIXTURE.name
    shutil.copytree(FIXTURE, source)  # builds write metadata next to the source: keep it out of the repo
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True)
    return target


def run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_an_installed_plugin_resolves_by_type_name(installed):
    out = run(RESOLVE.format(path=str(installed)))
    assert out == "resolved workbench_fixture_plugin FixtureBias True"


def test_a_plugin_on_the_path_but_not_installed_fails_helpfully():
    out = run(RESOLVE.format(path=str(FIXTURE)))  # importable, but no distribution metadata
    assert out.startswith("unknown Unknown adapter 'fixture_bias' at adapter.type. Registered: ")
    assert "'latent_residual'" in out.split(" | ")[0]  # installed plugins add their own names to the list
    assert "installed distribution metadata of *this* Python environment (not PYTHONPATH)" in out
    assert "importlib.metadata" in out


def test_a_plugin_trains_through_yaml(installed, tmp_path):
    code = f"""
import sys, torch
sys.path.insert(0, {str(installed)!r})
torch.set_num_threads(1)
from workbench.train.config import parse_experiment
from workbench.train import AdapterExperiment
config = parse_experiment({{
    "base": {{"type": "tiny_video", "config": {{"image_size": 16, "frames": 4, "width": 16, "ae_width": 8,
                                                "depth": 1}}}},
    "adapter": {{"type": "fixture_bias"}}, "composer": {{"type": "add"}},
    "training": {{"steps": 2, "batch_size": 4, "progress": False, "learning_rate": 0.1}},
    "data": {{"type": "synthetic_moves", "config": {{"items": 8, "frames": 4, "size": 16}}}}}})
exp = AdapterExperiment.from_config(config).fit()
print(exp.step, bool(exp.model.adapter.bias.abs().sum() > 0))
"""
    assert run(code) == "2 True"


def test_a_plugin_backbone_keeps_the_contract_through_the_kit(installed):
    """What a plugin author runs in their own tests: the backbone, built by name, checked in one call."""
    code = f"""
import sys, torch
sys.path.insert(0, {str(installed)!r})
torch.set_num_threads(1)
from workbench.config import build
from workbench.testing import check_backbone
g = torch.Generator().manual_seed(0)
raw = {{"video": torch.rand(2, 3, 4, 8, 8, generator=g) * 2 - 1, "action": torch.rand(2, 4, 4, generator=g)}}
report = check_backbone(lambda: build("backbone", "fixture_video", {{}}), raw=raw,
                        adapter_factory=lambda: build("adapter", "fixture_bias", {{"channels": 3}}))
print(type(report.findings[0]).__name__, [f.status for f in report.findings].count("kept"), len(report.findings))
"""
    assert run(code) == "Finding 12 13"  # all kept but "rollout", skipped: the fixture has no image condition


leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=8))
values = st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)
keys = st.sampled_from(["name", "base", "adapter", "composer", "objective", "training", "callbacks", "data",
                        "type", "config", "steps", "trianing"])
blocks = st.fixed_dictionaries({"type": st.sampled_from(["tiny_video", "latent_residual", "gated_residual",
                                                          "noise_gated", "nope", ""])},
                               optional={"config": st.dictionaries(st.sampled_from(
                                   ["width", "steps", "lo", "hi", "inner", "gate_init", "frames", "x"]), values,
                                   max_size=3)})
configs = st.one_of(values, st.dictionaries(keys, st.one_of(values, blocks), max_size=6))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs)
def test_config_loader_fuzz_only_raises_config_error(data):
    try:
        parse_experiment(data)
    except ConfigError as err:
        assert str(err).startswith("Invalid config")
