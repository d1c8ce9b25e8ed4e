"""Shared fixtures: tiny seeded models on one CPU thread."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MUJOCO_GL", "egl")
# torch.compile's inductor: kernels compile in this process (no pool of compile subprocesses, whose death
# would leave the test waiting on it for ever), into a cache of this worker's own (two workers compiling the
# same kernel on a fresh machine never meet in one directory). Both are read when inductor first loads.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import getpass
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}",
        f"workbench-tests-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

torch.set_num_threads(1)

from workbench import (  # noqa: E402
    BaseVideoModel,
    Batch,
    ComponentSpec,
    ComposedModel,
    Condition,
    FlowMatching,
    GatedResidual,
    ModelCard,
    SamplingDefaults,
    SideAdapter,
    StepRecord,
)
from workbench.backbones.tiny_video import TinyVideo, TinyVideoConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the local servers the browser tests start
from local_jupyter import free_port  # noqa: E402, F401 - shared with the tests that start servers

TINY = dict(image_size=16, frames=4, width=16, ae_width=8, depth=1, sampling_steps=4)

# -- what the shipped backbones take and what the conformance kit reports on them -------------------------------
#: The inputs each shipped backbone's ``example_batch()`` holds, written out: the conformance checks feed on the
#: example batch, so an input dropped from it would silently stop being checked; the tests compare against this.
EXAMPLE_BATCH_KEYS = {
    "tiny_video": {"video", "action", "proprio", "ee_pos", "camera", "control"},
    "wan22_ti2v": {"video", "action", "proprio", "ee_pos", "control", "prompt", "negative_prompt_embeds"},
    "easyanimate": {"video", "action", "proprio", "ee_pos", "control", "prompt", "negative_prompt_embeds",
                    "negative_prompt_attention_mask"},
}

#: The first line of ``check_backbone``'s report on each shipped backbone when every promise holds: how many
#: promises it checks (the required ones and those of the capabilities the backbone declares) and what it declares.
#: The CPU suite (tests/test_benchmarks.py, tests/test_docs_examples.py) and the CUDA one (tests/test_gpu.py) assert
#: these same lines, so a promise added to the kit changes the expectations of both at once.
_CAPABILITIES = "SamplingOptions, LatentLayout, CachesLatents, InsideAccess, MemoryPlanning, KeepsFloat32"
KEPT = {
    "tiny_video": "TinyVideo (tiny_video-{objective}) on {setting}: all 16 promises kept; declares GivenFrames, "
                  "LatentLayout, CachesLatents, InsideAccess, MemoryPlanning",
    "wan22_ti2v": "Wan22TI2V (wan2.2-ti2v:wan22-ti2v-tiny-v1) on {setting}: all 16 promises kept; declares "
                  + _CAPABILITIES,
    "easyanimate": "EasyAnimate (easyanimate:easyanimate-tiny-v1) on {setting}: all 16 promises kept; declares "
                   + _CAPABILITIES,
    "dynamicrafter": "DynamiCrafter (dynamicrafter-512:tiny random model) on {setting}: all 16 promises kept; "
                     "declares SamplingOptions, CachesLatents, InsideAccess, MemoryPlanning, KeepsFloat32",
}


def kept(backbone: str, setting: str, objective: str = "flow_matching") -> str:
    """``KEPT[backbone]`` for the setting ``"cpu float32"``, ``"cuda bfloat16"``, ... (and tiny_video's objective)."""
    return KEPT[backbone].format(setting=setting, objective=objective)



def _installed(dist: str) -> bool:
    from importlib import metadata

    try:
        metadata.distribution(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


requires_plugins = pytest.mark.skipif(
    not all(map(_installed, ("diffusers", "workbench-wan22", "workbench-easyanimate"))),
    reason="the backbone plugins are not installed in this environment (make install installs them: "
           "pip install -c constraints.txt -e '.[diffusers]' -e plugins/wan22 -e plugins/easyanimate)",
)


def tiny_base(**overrides) -> TinyVideo:
    torch.manual_seed(0)
    return TinyVideo(TinyVideoConfig(**{**TINY, **overrides}))


def nonzero_model(objective: str = "flow_matching", composer=None, adapter_cls=None) -> ComposedModel:
    """tiny_video with an adapter whose output (and gate) is far from zero, so it changes the samples."""
    from workbench.adapters.latent_residual import LatentResidual

    base = tiny_base(objective=objective)
    adapter = (adapter_cls or LatentResidual)(width=16, depth=1)
    with torch.no_grad():
        g = torch.Generator().manual_seed(7)
        for p in adapter.out.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    composer = composer if composer is not None else GatedResidual(gate_init=0.5)
    return ComposedModel(base, adapter, composer, base.default_objective())


class BaseCalls:
    """Counts the frozen base's denoise calls."""

    def __init__(self, model: ComposedModel):
        self.count = 0
        denoise = model.base.denoise

        def counted(*args, **kwargs):
            self.count += 1
            return denoise(*args, **kwargs)

        model.base.denoise = counted


def perturb(model, seed: int = 3) -> None:
    """Move every trainable parameter of ``model`` away from its init (so the adapter changes the base)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


def assert_resume_is_bit_exact(make, data, tmp_path: Path, steps: int = 4):
    """``make(out=None)`` builds a fresh experiment: ``steps`` in one run equal ``steps // 2``, a checkpoint,
    a fresh experiment loading it and the rest — loss history and trainable weights bit for bit. Returns
    the uninterrupted experiment."""
    full = make()
    full.fit(data, steps=steps)
    part = make(tmp_path)
    part.fit(data, steps=steps // 2)
    resumed = make().load_checkpoint(part.save_checkpoint())
    resumed.fit(data, steps=steps - steps // 2)
    a, b = resumed.model.trainable_state_dict(), full.model.trainable_state_dict()
    assert resumed.loss_history == full.loss_history and all(torch.equal(a[k], b[k]) for k in a)
    return full


def raw_batch(b: int = 2, t: int = 4, size: int = 16, seed: int = 0, actions: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    raw = {"video": torch.rand(b, 3, t, size, size, generator=g) * 2 - 1}
    if actions:
        raw["action"] = torch.rand(b, t, 4, generator=g) * 2 - 1
    return raw


@pytest.fixture
def base() -> TinyVideo:
    return tiny_base()


@pytest.fixture
def raw() -> dict:
    return raw_batch()


class ToyBackbone(BaseVideoModel):
    """A deliberately awkward base: batch norm and dropout, which train mode would change."""

    def __init__(self, channels: int = 4, provides=("action", "fs", "c_concat")):
        super().__init__()
        self.net = nn.Sequential(nn.Conv3d(channels, 8, 1), nn.BatchNorm3d(8), nn.Dropout(0.5),
                                 nn.Conv3d(8, channels, 1))
        self._provides = tuple(provides)
        self.card = ModelCard(model_id="toy", family="toy", prediction_type="velocity",
                              components={"denoiser": ComponentSpec("denoiser")},
                              sampling=SamplingDefaults(steps=3), capabilities=("i2v",))
        self.calls = 0

    def provides(self):
        return self._provides

    def default_objective(self):
        return FlowMatching()

    def prepare_batch(self, raw):
        if isinstance(raw, Batch):
            return raw
        cond = {k: v for k, v in raw.items() if k != "latents"}
        per_frame = frozenset(k for k, v in cond.items() if k == "action" or (k.startswith("pf_")))
        return Batch(latents=raw["latents"], cond=cond, per_frame=per_frame)

    def encode(self, video):
        return video

    def decode(self, latents):
        return latents

    def denoise(self, x_t, t, cond):
        self.calls += 1
        return self.net(x_t) * (1 + t.view(-1, 1, 1, 1, 1))

    def run_sampler(self, batch, *, steps, sampler, generator, compose_fn, on_step, **kwargs):
        x = torch.randn(batch.latents.shape, generator=generator)
        times = torch.linspace(1, 0, steps + 1)
        for i in range(steps):
            t = times[i].expand(x.shape[0])
            pred = compose_fn(x, t, batch)
            x_next = x + (times[i + 1] - times[i]) * pred
            if on_step:
                on_step(StepRecord(i, steps, t, x, pred, x_next))
            x = x_next
        return x


class RecordingAdapter(SideAdapter):
    """A small nonzero adapter that remembers the conditioning it was given."""

    def __init__(self, consumes=(Condition("action", dim=4, per_frame="mean"),), channels: int = 4,  # noqa: B008
                 zero: bool = False):
        super().__init__()
        self.consumes = tuple(consumes)
        self.proj = nn.Linear(4, channels)
        self.mix = nn.Conv3d(channels, channels, 1)
        if zero:
            for p in self.parameters():
                nn.init.zeros_(p)
        self.seen = []

    def forward(self, x_t, t, cond, base_output=None):
        self.seen.append(cond)
        out = self.mix(x_t)
        action = cond.declared.get("action")
        if action is not None:
            a = action if action.ndim == 2 else action.mean(1)
            out = out + self.proj(a)[:, :, None, None, None]
        return out


def toy_raw(b: int = 2, t: int = 3, seed: int = 0, **extra) -> dict:
    g = torch.Generator().manual_seed(seed)
    raw = {"latents": torch.randn(b, 4, t, 2, 2, generator=g), "action": torch.randn(b, t, 4, generator=g),
           "fs": torch.tensor([3.0] * b), "c_concat": torch.randn(b, 4, 2, 2, generator=g)}
    raw.update(extra)
    return raw


class DeviceReads:
    """Counts the reads of tensor values back to the host made by workbench's own code while
    active (``item``, ``cpu``, ``tolist``, ``float()``, ``int()``, ``bool()``, ``numpy``): on a GPU
    each is a device sync. ``calls`` lists them as ``"<read> in <function>"``.

    Library internals are out of scope (e.g. AdamW's step counter lives on the host by design),
    and so is the user's data loading, which runs on the host before the transfer.
    """

    READS = ("item", "cpu", "tolist", "__float__", "__int__", "__bool__", "numpy")

    def __init__(self):
        import workbench

        self.package = os.path.dirname(workbench.__file__)
        self.calls: list[str] = []
        self._saved: dict[str, object] = {}

    def __enter__(self) -> DeviceReads:
        import sys

        for name in self.READS:
            original = self._saved[name] = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, _name=name, **kwargs):
                caller = sys._getframe(1).f_code
                if caller.co_filename.startswith(self.package):
                    self.calls.append(f"{_name} in {caller.co_name}")
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)


@pytest.fixture
def preview_cache(tmp_path, monkeypatch):
    """A scratch workbench cache for fitted previews, the in-memory previews forgotten before and after."""
    from workbench.inspect import clear_preview_cache

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    clear_preview_cache()
    yield tmp_path / "previews"
    clear_preview_cache()


def count_decodes(base) -> list[int]:
    """Counts ``base.decode`` calls from here on (``calls[0]``)."""
    calls = [0]
    decode = base.decode

    def counted(latents):
        calls[0] += 1
        return decode(latents)

    base.decode = counted
    return calls


def chromium() -> str:
    """Debian's chromium, which the browser tests drive; skips the test, saying why, when it is absent."""
    import shutil

    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("Debian's chromium is not installed: `make test` installs it with apt-get (as root); this "
                    "machine could not (install it with `apt-get install chromium`).")
    return path


# -- the notebooks (collected beside the tests by `pytest tests notebooks --nbval`) --------------
# Under nbval the notebooks run the pretrained tiny_video, notebook 6 the diffusers backbone
# plugins and notebook 7 the DynamiCrafter plugin: a notebook whose requirements are not
# installed is skipped with the reason (and the fix) instead of failing.
import importlib.metadata as metadata  # noqa: E402

from workbench.backbones.tiny_video import WEIGHTS_DIR  # noqa: E402

WEIGHTS = WEIGHTS_DIR / "tiny_video.safetensors"
PLUGIN_DISTRIBUTIONS = ("diffusers", "workbench-wan22", "workbench-easyanimate")
NEEDS_PLUGINS = ("06_diffusers_backbone.ipynb",)
NEEDS_DYNAMICRAFTER = ("07_dynamicrafter_backbone.ipynb",)


def _missing(distributions: tuple[str, ...]) -> list[str]:
    missing = []
    for name in distributions:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def _skip_reason(notebook: str) -> str | None:
    if notebook in NEEDS_DYNAMICRAFTER:
        missing = _missing(("diffusers", "transformers", "workbench-dynamicrafter"))
        if missing:
            return (f"{notebook} runs the DynamiCrafter backbone plugin, and {', '.join(missing)} is not installed in "
                    f"this environment (make install installs it: pip install -c constraints.txt -e '.[diffusers]' "
                    f"-e plugins/dynamicrafter).")
        return None
    if notebook in NEEDS_PLUGINS:
        missing = _missing(PLUGIN_DISTRIBUTIONS)
        if missing:
            return (f"{notebook} runs the diffusers backbone plugins, and {', '.join(missing)} is not installed in "
                    f"this environment (make install installs them: pip install -c constraints.txt -e "
                    f"'.[diffusers]' -e plugins/wan22 -e plugins/easyanimate).")
        return None
    if not WEIGHTS.exists():
        return (f"the pretrained tiny_video weights are not installed ({WEIGHTS}); the notebooks run on them. Train "
                f"them with `workbench pretrain` or install a release that ships them.")
    return None


#: Test files that must not overlap with each other when the suite runs on several workers: the browser
#: tests start a server and a browser each and wait on them. (Every file, and every notebook, already runs
#: on one worker, in order: see pytest_xdist_make_scheduler.)
SERIAL_GROUPS = {"test_widgets_browser.py": "browser tests", "test_widgets_lab.py": "browser tests",
                 "test_widgets_drive_browser.py": "browser tests"}


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (make test runs the suite on three workers)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, with the files of a SERIAL_GROUPS group as one unit.

    A file's tests share its module fixtures, a notebook's cells share one kernel, and the torchrun
    tests start two ranks each: all run on one worker, in order. (``--dist loadgroup`` would say the
    same with marks, but pytest-xdist 3.8 loses the marks under pytest 9.2's node ids.)
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByFile(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return SERIAL_GROUPS.get(Path(file).name, file)

    config.option.loadscopereorder = False  # files go out in collection order: the long ones first (below)
    return ByFile(config, log)


#: CPU seconds assumed for a file the budget table (tests/cpu_budget.py) does not list yet: the ones known to
#: be long, then any notebook (a kernel and a minute of cells), then anything else.
UNMEASURED = {"test_install.py": 60, "test_distributed.py": 60, "test_pretrain_demo.py": 60, "test_widgets_lab.py": 60,
              "test_widgets_browser.py": 60, "test_widgets_drive_browser.py": 60, "test_evaluate.py": 50,
              "test_compile.py": 50, "test_plugin_backbones.py": 40, "test_plugin_dynamicrafter.py": 40,
              "test_data_lerobot.py": 40, ".ipynb": 30}


def _start_rank(path: Path) -> float:
    """The longest files start first (their checked-in CPU seconds, tests/cpu_budget.py, largest first), so
    that no worker is left running a long one alone at the end: the longest-first greedy order, which the
    scheduler completes by handing the next file to whichever worker frees up. This orders the work only;
    every file still runs whole and in its own order."""
    from cpu_budget import BUDGET

    seconds = BUDGET.get(f"{path.parent.name}/{path.name}")
    if seconds is None:
        seconds = UNMEASURED.get(path.name, UNMEASURED[".ipynb"] if path.suffix == ".ipynb" else 0.0)
    return -seconds


#: The node id of every test this session collected, before any selection (node ids, ``-k``, ``-m``,
#: ``--deselect``) narrowed what runs: a test that counts its own file's cases reads it.
COLLECTED: set[str] = set()


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if report.passed:
        COLLECTED.update(node.nodeid for node in report.result if isinstance(node, pytest.Item))
    return report


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: _start_rank(Path(str(item.fspath))))  # stable: each file keeps its order
    reasons: dict[str, str | None] = {}
    for item in items:
        path = Path(str(item.fspath))
        if path.suffix != ".ipynb":
            continue
        if path.name not in reasons:
            reasons[path.name] = _skip_reason(path.name)
        if reasons[path.name] is not None:
            item.add_marker(pytest.mark.skip(reason=reasons[path.name]))


# -- damage, runs and the CLI in process (the reliability and fault-injection tests share these) ---------
TINY_RUN = {
    "name": "tiny-run",
    "base": {"type": "tiny_video", "config": {"image_size": 16, "frames": 4, "width": 16, "ae_width": 8, "depth": 1}},
    "adapter": {"type": "latent_residual", "config": {"width": 16, "depth": 1, "dropout": 0.1}},
    "training": {"steps": 4, "learning_rate": 5.0e-3, "batch_size": 4, "sync_every": 1, "checkpoint_every": 2,
                 "keep_last": 5},
    "callbacks": [{"type": "jsonl", "config": {"every_n_steps": 1}}],
    "data": {"type": "synthetic_moves", "config": {"items": 8, "frames": 4, "size": 16}},
}


def write_run_config(path: Path, **changes) -> Path:
    """TINY_RUN with dotted-path changes (``training.learning_rate=...``; None deletes), as YAML at ``path``."""
    import copy

    import yaml

    config = copy.deepcopy(TINY_RUN)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = config
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``workbench ARGV`` in this process: ``(exit status, stdout, stderr)``; a traceback never passes."""
    from workbench.cli import main

    capsys.readouterr()
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return status, out, err


def flip_bits(path: Path, seed: int, count: int = 1, region: tuple[int, int] | None = None) -> list[int]:
    """Flip ``count`` seeded bits of ``path`` (inside ``region`` = [start, stop) bytes when given);
    returns the byte offsets."""
    import random

    data = bytearray(path.read_bytes())
    rng = random.Random(seed)
    start, stop = region or (0, len(data))
    offsets = [rng.randrange(start, stop) for _ in range(count)]
    for offset in offsets:
        data[offset] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return offsets


def truncate(path: Path, seed: int) -> int:
    """Cut ``path`` at a seeded length in [0, size); returns the new length."""
    import random

    size = path.stat().st_size
    keep = random.Random(seed).randrange(size)
    with open(path, "r+b") as f:
        f.truncate(keep)
    return keep


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes (to show that a refused command changed nothing)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def small_metaworld_file(path: Path, episodes=(0, 1, 10, 11), frames: int = 20) -> Path:
    """A few episodes of the shipped sample, written as `workbench data metaworld` writes (gzip, one chunk
    per episode): small enough to damage and read in a blink."""
    import h5py
    import numpy as np

    from workbench.data.metaworld import sample_path

    with h5py.File(sample_path()) as src, h5py.File(path, "w") as out:
        idx = list(episodes)
        for name in ("frames", "actions", "ee_pos", "proprio", "obs", "reward", "expert"):
            data = src[name][idx, :frames]
            out.create_dataset(name, data=data, chunks=(1, *data.shape[1:]), compression="gzip", compression_opts=9)
        out.create_dataset("task", data=np.array([src["task"][i] for i in idx], dtype=object),
                           dtype=h5py.string_dtype())
        out.create_dataset("success", data=src["success"][idx])
        for key, value in src.attrs.items():
            out.attrs[key] = value
    return path


# CPU seconds per test, into the JUnit report (the per-file budget: tests/cpu_budget.py)
from cpu_budget import pytest_runtest_protocol, pytest_runtest_teardown  # noqa: E402, F401 - hooks


@pytest.fixture(autouse=True)
def _ctrl_c_left_as_found(request):
    """Ctrl-C reaches every test as a fresh process would see it: the default handler, not blocked. A test
    (or a process it drove) that leaves SIGINT ignored or blocked would make the Ctrl-C tests after it in the
    same worker wait forever; it is put back and the test is named in a warning."""
    import signal
    import warnings

    yield
    if threading_is_main():
        handler = signal.getsignal(signal.SIGINT)
        blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        if handler is not signal.default_int_handler or blocked:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
            warnings.warn(f"{request.node.nodeid} left SIGINT {'blocked' if blocked else handler!r}; restored",
                          stacklevel=1)


def threading_is_main() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
