"""Training against drift (``training.context``): off is today's loop bit for bit, the options change only
the context frames, and a run with them resumes bit-exactly."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import torch
from torch.utils.data import Dataset

from workbench.errors import ConfigError, DataError
from workbench.train.config import load_yaml, parse_experiment
from workbench.train.context import CONTEXT_NOISE, ContextConfig, ContextSource, context_label
from workbench.train.experiment import AdapterExperiment

torch.set_num_threads(1)

#: The trainable weights and losses of examples/configs/tiny.yaml after 3 steps, measured on the loop before
#: training.context existed (the commit before it, cc1e30c~1): each tensor's sum of absolute values. Their last
#: bits follow the CPU's kernels (oneDNN's and MKL's blocking differ between AVX-512 and AVX2, and between CPU
#: models with the same instructions), so these are compared within 1e-5 of themselves, which every kernel seen
#: meets (the AVX2 and AVX-512 kernels of one machine differ by 1e-7); that the option off gives the very bits
#: of the loop without it is checked against a run of that loop in the same process.
TODAY_ABS_SUMS = {
    "adapter.blocks.0.film.bias": 2.564016,
    "adapter.blocks.0.film.weight": 89.7272,
    "adapter.blocks.0.norm1.bias": 0.01344044,
    "adapter.blocks.0.norm1.weight": 15.99748,
    "adapter.blocks.0.norm2.bias": 0.01913771,
    "adapter.blocks.0.norm2.weight": 15.9807,
    "adapter.blocks.0.spatial.bias": 0.6965602,
    "adapter.blocks.0.spatial.weight": 96.3853,
    "adapter.blocks.0.temporal.bias": 1.244348,
    "adapter.blocks.0.temporal.weight": 55.1281,
    "adapter.cond_mlp.0.bias": 8.120474,
    "adapter.cond_mlp.0.weight": 31.72983,
    "adapter.cond_mlp.2.bias": 2.931076,
    "adapter.cond_mlp.2.weight": 93.02383,
    "adapter.out.bias": 0.009035983,
    "adapter.out.weight": 1.308648,
    "adapter.out_norm.bias": 0.0246826,
    "adapter.out_norm.weight": 16.02267,
    "adapter.stem.bias": 0.7308797,
    "adapter.stem.weight": 81.77574,
    "adapter.time.0.bias": 4.487561,
    "adapter.time.0.weight": 65.55403,
    "adapter.time.2.bias": 2.656932,
    "adapter.time.2.weight": 89.85581,
    "composer.inner.gate": 0.1015331,
}
TODAY_LOSSES = [1.06425, 1.021696, 1.032752]


class EpisodeWindows(Dataset):
    """Windows of 8 frames every 2 frames of 3 episodes of 14 frames of a moving square, with the
    ``index`` of ``(episode, start)`` that self-forwarded contexts look earlier windows up in."""

    def __init__(self, episodes: int = 3, frames: int = 14, window: int = 8, stride: int = 2):
        g = torch.Generator().manual_seed(7)
        self.actions = torch.rand(episodes, frames, 4, generator=g) * 2 - 1
        self.video = torch.full((episodes, 3, frames, 16, 16), -1.0)
        for e in range(episodes):
            pos = torch.rand(2, generator=g) * 12
            for t in range(frames):
                x, y = (int(v) for v in pos.round().tolist())
                self.video[e, :, t, y:y + 4, x:x + 4] = 1.0
                pos = (pos + self.actions[e, t, :2] * 2.0).clamp(0, 12)
        self.window = window
        self.index = [(e, s) for e in range(episodes) for s in range(0, frames - window + 1, stride)]

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        e, s = self.index[i]
        return {"video": self.video[e, :, s:s + self.window].clone(),
                "action": self.actions[e, s:s + self.window].clone(), "episode": e, "start": s}


def _config(steps: int = 3, context: dict | None = None, tmp_path=None):
    config = load_yaml("examples/configs/tiny.yaml")
    training = dataclasses.replace(config.training, steps=steps, checkpoint_every=None, progress=False,
                                   output_dir=str(tmp_path) if tmp_path else None)
    if context is not None:
        data = {**_as_dict(config), "training": {**_as_dict(config)["training"], "context": context}}
        config = parse_experiment(data)
        training = dataclasses.replace(config.training, steps=steps, checkpoint_every=None, progress=False,
                                       output_dir=str(tmp_path) if tmp_path else None)
    return dataclasses.replace(config, training=training, callbacks=[])


def _as_dict(config):
    from workbench.train.config import experiment_to_dict

    return experiment_to_dict(config)


def _digest(exp) -> str:
    h = hashlib.sha256()
    for k, v in sorted(exp.model.trainable_state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _abs_sums(exp) -> dict[str, float]:
    return {k: float(v.detach().double().abs().sum()) for k, v in sorted(exp.model.trainable_state_dict().items())}


@pytest.mark.parametrize("context", [None, {"source": "recorded"}, {"source": "self_forwarded", "p": 0.0},
                                     {"source": "corrupted", "p": 0.0}])
def test_off_trains_exactly_as_the_loop_without_the_option(context):
    exp = AdapterExperiment.from_config(_config(context=context))
    assert exp.context is None
    exp.fit(progress=False)
    assert _abs_sums(exp) == pytest.approx(TODAY_ABS_SUMS, rel=1e-5, abs=0)
    assert [round(v, 6) for v in exp.loss_history] == TODAY_LOSSES
    plain = AdapterExperiment.from_config(_config())  # and the same bits as the run without the block, here
    plain.fit(progress=False)
    assert _digest(exp) == _digest(plain)


def test_the_run_records_the_context_it_trained_on():
    exp = AdapterExperiment.from_config(_config(context={"source": "self_forwarded", "p": 0.5, "steps": 1}))
    recorded = exp.resolved_config()["training"]["context"]
    assert recorded == {"source": "self_forwarded", "p": 0.5, "max_level": 0.3, "steps": 1, "stride": None,
                        "gate_scale": None}
    assert context_label(exp.resolved_config()) == "trained on produced context p=0.5 (one-step estimates)"
    assert context_label({"training": {}}) == "trained on recorded context"


def _source(config: ContextConfig, data: EpisodeWindows):
    exp = AdapterExperiment.from_config(_config())
    source = ContextSource(config, exp.model, seed=0)
    source.bind(data)
    return source


def _raw(data, indices):
    from torch.utils.data import default_collate

    return default_collate([data[i] for i in indices])


def test_self_forwarded_replaces_only_the_context_of_windows_with_an_earlier_window():
    data = EpisodeWindows()
    source = _source(ContextConfig(source="self_forwarded", p=1.0), data)
    raw = _raw(data, [0, 1, 3, 5])                  # starts 0, 2, 6, 2 (episodes 0, 0, 0, 1)
    before = raw["video"].clone()
    out, level = source.apply(raw, step=0, micro=0)
    assert torch.equal(raw["video"], before)        # the served batch is untouched
    assert torch.equal(level, torch.zeros(4))
    assert torch.equal(out["video"][:, :, 1:], before[:, :, 1:])
    assert torch.equal(out["video"][0], before[0])  # a window at the episode's first frame keeps its context
    changed = (out["video"][1:, :, 0] != before[1:, :, 0]).flatten(1).any(1)
    assert changed.tolist() == [True, True, True]
    grid = (out["video"][1:, :, 0] + 1) * 127.5     # frames as a rollout hands them on: 8-bit values
    assert torch.allclose(grid, grid.round(), atol=1e-4)
    assert source.counts == {"windows": 4, "changed": 3}
    again, _ = source.apply(raw, step=0, micro=0)   # a pure function of (seed, step, micro) and the weights
    assert torch.equal(again["video"], out["video"])
    other, _ = source.apply(raw, step=1, micro=0)
    assert not torch.equal(other["video"], out["video"])


def test_the_earlier_window_is_the_farthest_within_the_stride():
    data = EpisodeWindows()
    source = _source(ContextConfig(source="self_forwarded", stride=5), data)
    assert source.stride == 5
    assert source._earlier(0, 6) == (data.index.index((0, 2)), 4)   # 6 - 5 = 1 is no window start: 2 is
    assert source._earlier(0, 0) is None
    assert _source(ContextConfig(source="self_forwarded"), data).stride == 7   # 8 frames, 1 context frame


class AnyStart(EpisodeWindows):
    """The same episodes, serving a window at any start (``window_at``), as the metaworld and lerobot datasets do."""

    def window_at(self, episode, start):
        return {"video": self.video[episode, :, start:start + self.window].clone(),
                "action": self.actions[episode, start:start + self.window].clone(), "episode": episode,
                "start": start}


def test_data_that_serves_any_start_gives_the_window_exactly_the_stride_back():
    data = AnyStart()
    source = _source(ContextConfig(source="self_forwarded", p=1.0, stride=5), data)
    assert source._earlier(0, 6) == ((0, 1), 5)      # frame 1: no window of the index starts there
    assert source._earlier(1, 4) == ((1, 0), 4)      # nearer than the stride: from the episode's first frame
    assert source._earlier(1, 0) is None
    out, _ = source.apply(_raw(data, [3]), step=0, micro=0)     # episode 0 from frame 6
    expected, _ = source.apply(_raw(data, [3]), step=0, micro=0)
    assert torch.equal(out["video"], expected["video"])
    assert not torch.equal(out["video"][:, :, 0], _raw(data, [3])["video"][:, :, 0])


def test_the_metaworld_and_lerobot_datasets_serve_a_window_at_any_start(tmp_path):
    pytest.importorskip("h5py")
    from workbench.data.metaworld import MetaWorldClips
    from workbench.train.data import LatentCache

    clips = MetaWorldClips(path="sample", window=16, stride=4, split="train")
    episode, start = clips.index[5]
    assert all(torch.equal(clips.window_at(episode, start)[k], clips[5][k]) for k in ("video", "action"))
    odd = clips.window_at(episode, 3)
    assert odd["start"] == 3 and torch.equal(odd["video"][:, 1:], clips.window_at(episode, 4)["video"][:, :-1])
    with pytest.raises(DataError, match=r"no window at episode .*, step 40 in this split: episodes .*starts 0 to 32"):
        clips.window_at(episode, 40)
    from workbench.backbones.tiny_video import TinyVideo

    pytest.importorskip("pyarrow")
    pytest.importorskip("av")
    import lerobot_fixture as fx

    from workbench.data.lerobot import LeRobotClips

    root = fx.write(tmp_path / "ds", "v3.0")
    robot = LeRobotClips(root=str(root), camera=fx.CAMERAS[0], window=4, stride=2, split="all")
    item = robot[len(robot) - 1]
    again = robot.window_at(item["episode"], item["start"])
    assert torch.equal(again["video"], item["video"]) and torch.equal(again["action"], item["action"])
    assert robot.window_at(item["episode"], 1)["start"] == 1
    with pytest.raises(DataError, match=r"no window at episode .*, frame 99 in this split"):
        robot.window_at(item["episode"], 99)
    cache = LatentCache(clips, TinyVideo(image_size=64, frames=16, width=16, ae_width=8, depth=1))
    assert torch.equal(cache.window_at(episode, start)["latents"], cache[5]["latents"])


def test_corrupted_moves_only_the_context_towards_noise_and_says_the_level():
    data = EpisodeWindows()
    source = _source(ContextConfig(source="corrupted", p=0.5, max_level=0.3), data)
    raw = _raw(data, range(8))
    out, level = source.apply(raw, step=3, micro=0)
    assert torch.equal(out["video"][:, :, 1:], raw["video"][:, :, 1:])
    picked = level > 0
    assert 0 < int(picked.sum()) < 8 and float(level.max()) <= 0.3
    assert torch.equal(out["video"][~picked], raw["video"][~picked])
    assert (out["video"][picked, :, 0] != raw["video"][picked, :, 0]).flatten(1).any(1).all()
    batch = source.finish(source.model.base.prepare_batch(out), level)
    assert torch.equal(batch.cond[CONTEXT_NOISE], level)


def test_resume_mid_run_equals_the_uninterrupted_run_with_the_option_on(tmp_path):
    data = EpisodeWindows()
    context = {"source": "self_forwarded", "p": 0.5, "steps": 1}
    whole = AdapterExperiment.from_config(_config(steps=4, context=context)).fit(data, progress=False)
    assert whole.context.counts["changed"] > 0
    first = AdapterExperiment.from_config(_config(steps=4, context=context, tmp_path=tmp_path))
    first.fit(data, steps=2, progress=False)
    first.save_checkpoint(tmp_path)
    config = _config(steps=4, context=context, tmp_path=tmp_path)
    resumed = AdapterExperiment.resume(tmp_path, config).fit(data, progress=False)
    assert resumed.step == 4
    assert _digest(resumed) == _digest(whole)
    assert resumed.loss_history == whole.loss_history
    plain = AdapterExperiment.from_config(_config(steps=4)).fit(data, progress=False)
    assert _digest(plain) != _digest(whole)         # the option did change the training
    other = _config(steps=4, context={**context, "p": 0.25}, tmp_path=tmp_path)
    with pytest.raises(ConfigError, match=r"training\.context\.p"):
        AdapterExperiment.resume(tmp_path, other)
    changed = AdapterExperiment.resume(tmp_path, other, override=["training.context"])
    assert changed.config_changes == [{"step": 2, "field": "training.context.p", "from": 0.5, "to": 0.25,
                                       "bit_exact": False}]


@pytest.mark.parametrize("block, match", [
    ({"source": "self_forwarding"},
     r"training\.context\.source: got str 'self_forwarding'; allowed.*Did you mean 'self_forwarded'"),
    ({"p": 1.5}, r"training\.context\.p: must be in \[0, 1\].*got 1\.5"),
    ({"steps": 0}, r"training\.context\.steps: must be an int >= 1.*got 0"),
    ({"max_level": 0}, r"training\.context\.max_level: must be in \(0, 1\]"),
    ({"sorce": "corrupted"}, r"training\.context\.sorce: unknown key.*Did you mean 'source'"),
])
def test_a_bad_context_block_is_refused_naming_the_field(block, match):
    with pytest.raises(ConfigError, match=match):
        _config(context=block)


def test_self_forwarded_without_an_index_says_what_data_it_needs():
    from workbench.data.synthetic import SyntheticMoves

    exp = AdapterExperiment.from_config(_config(context={"source": "self_forwarded"}))
    with pytest.raises(DataError, match=r"self_forwarded needs a map-style dataset whose index lists each "
                                        r"item's \(episode, start\).*got SyntheticMoves without an index"):
        exp.fit(SyntheticMoves(items=8, frames=8, size=16), steps=1, progress=False)


# -- the instruments say what context the adapter was trained to expect -------------------------------------------
def test_stepper_and_drive_show_the_context_the_adapter_was_trained_on():
    pytest.importorskip("ipywidgets")
    from workbench.inspect.drive import DriveState
    from workbench.inspect.stepper import StepperState
    from workbench.widgets import Drive, Stepper

    exp = AdapterExperiment.from_config(_config(context={"source": "self_forwarded", "p": 0.5}))
    label = "trained on produced context p=0.5 (2-step samples)"
    assert exp.model.trained_context == label
    data = EpisodeWindows()
    traj = exp.sample(_raw(data, [1]), steps=2, seed=0)
    assert StepperState(traj).context_note == label
    view = Stepper(traj)
    view.refresh()
    assert f"<i>{label}</i>" in view.where.value
    start = {"video": data.video[0, :, :4], "action": data.actions[0, :4]}
    assert DriveState(exp.model, start, steps=2, readout=None).context_note == (
        f"adapter {label}; chunk 0 continues from the recorded frame, later chunks from produced frames")
    drive = Drive(exp.model, start, steps=2, readout=None)
    drive._status()
    assert f"adapter {label}" in drive.status.value
    plain = AdapterExperiment.from_config(_config())
    assert StepperState(plain.sample(_raw(data, [1]), steps=2, seed=0)).context_note == "trained on recorded context"
