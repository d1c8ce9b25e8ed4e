"""What the world-model wing's evaluations share: the run, the data it was trained on, the clips.

:func:`load_run` opens a run directory's experiment, with advice on a wrong path; :func:`run_data`
and :func:`data_options` say which data it was trained on and how to read more of it;
:func:`clip_source` opens clips of a Meta-World file or a LeRobot dataset (the shipped ``sample``,
``unseen`` and any other), :func:`spread_over_tasks` picks some of them over every task, and
:func:`swap_partner` pairs each clip with one of another episode. :func:`json_safe` makes results
JSON-ready. :mod:`~workbench.worldmodel.evaluate`, :mod:`~workbench.worldmodel.rollout_eval`,
:mod:`~workbench.worldmodel.policies` and :mod:`~workbench.worldmodel.demo` build on them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.errors import CheckpointError, DataError

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from workbench.train.experiment import AdapterExperiment

#: Six Meta-World tasks outside pretraining and the demo's training set, generated with their own seed
#: (see docs/guides/world-model.md, "Unseen tasks").
UNSEEN_PATH = Path(__file__).resolve().parents[1] / "data" / "samples" / "metaworld_unseen.h5"


class Columns:
    """Rows held as named columns (``arrays``, one row per episode or start state): ``len()`` is the number of
    rows and ``obj.name`` reads the column ``name``."""

    arrays: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.arrays["task"])

    def __getattr__(self, name: str) -> np.ndarray:
        arrays = self.__dict__.get("arrays", {})
        if name in arrays:
            return arrays[name]
        raise AttributeError(name)


def load_run(run_dir: str | Path, *, again: str | None = None) -> AdapterExperiment:
    """The :class:`AdapterExperiment` of a run directory (its latest checkpoint) or of one checkpoint.

    Args:
        run_dir: A run directory (its latest checkpoint is loaded) or one ``step-*`` checkpoint.
        again: The rest of the ``workbench eval`` command line, for the advice on a damaged checkpoint
            (evaluate the newest one that verifies with it).

    Returns:
        The :class:`AdapterExperiment`, loaded.

    Raises:
        CheckpointError: When the path is a file, missing, or holds no checkpoint that verifies; the
            message says what to pass instead.
    """
    from workbench.train.checkpoint import latest_checkpoint
    from workbench.train.experiment import AdapterExperiment

    path = Path(run_dir)
    if path.is_file():
        data = " (a data file)" if path.suffix in (".h5", ".hdf5") else ""
        raise CheckpointError(f"{path} is a file{data}, not a run directory. "
                              f"`workbench eval` takes the adapter's run directory first "
                              f"and the data with --data: workbench eval RUN_DIR --data {path} "
                              f"(e.g. RUN_DIR = outputs/demo/run).")
    if not path.is_dir():
        raise CheckpointError(f"Run directory not found: {path}. "
                              f"Pass the directory `workbench train` / `workbench demo` wrote "
                              f"(e.g. outputs/demo/run) or one of its step-* checkpoints.")
    if (path / "meta" / "info.json").is_file():
        raise CheckpointError(f"{path} is a LeRobot dataset, not a run directory. "
                              f"`workbench eval` takes the adapter's run directory first "
                              f"and the data with --data: workbench eval RUN_DIR --data {path}.")
    if not (path / "meta.json").exists() and latest_checkpoint(path) is None:
        raise CheckpointError(f"{path} holds no adapter checkpoint (no step-*/ directory, no LATEST). "
                              f"Pass the run directory of a finished `workbench train` or `workbench demo` "
                              f"(e.g. outputs/demo/run), or save one with exp.save_checkpoint().")
    use = f"evaluate it instead with `workbench eval {{checkpoint}}{(' ' + again) if again else ''}`"
    return AdapterExperiment.load(path, use=use)


def run_data(exp) -> str:
    """The data a run was trained on, as a ``--data`` value (``sample`` when it names no file)."""
    block = exp.resolved_config().get("data") or {}
    options = block.get("config") or {}
    return str(options.get("root") or options.get("path") or "sample")


def data_options(exp, path: str, args: Any = None) -> dict[str, Any]:
    """The dataset options evaluation reads ``path`` with: the run's own (its ``data:`` block's camera,
    actions, state, end-effector feature and frame rate, when ``path`` is of the same kind), then the
    command line's data options (``args``); no state when the adapter reads none."""
    from workbench.data.sources import data_kind
    from workbench.train.options import DataOptions

    run = exp.resolved_config().get("data") or {}
    kind = data_kind(str(UNSEEN_PATH) if path == "unseen" else path)
    options: dict[str, Any] = {}
    if run.get("type") == kind == "lerobot":
        saved = run.get("config") or {}
        options = {k: saved[k] for k in ("camera", "actions", "state", "ee_pos", "fps") if k in saved}
    if args is not None:
        options.update(DataOptions.from_args(args).dataset())
    reads = {key for c in exp.model.adapter.consumes for key in c.keys}
    if kind == "lerobot" and "proprio" not in reads:
        options["state"] = None  # the adapter reads no state: the data need not have one
    return options


def clip_source(path: str, *, window: int, split: str = "val", stride: int | None = None,
                size: tuple[int, int] | None = None, tasks: list[str] | None = None,
                camera: str | None = None, control: str | None = None, **options: Any) -> Dataset:
    """``window``-frame clips of a Meta-World file or a LeRobot dataset, one every ``stride`` frames
    (default: ``window``), through :func:`workbench.data.sources.open_clips`.

    A LeRobot dataset with an ``observation.ee_pos`` feature (the Meta-World writer's) serves it as
    ``ee_pos``, so the action error is scored.

    Args:
        path: A Meta-World ``.h5`` file, a LeRobot dataset directory, ``"sample"`` (the shipped sample,
            six training tasks) or ``"unseen"`` (the shipped file of six tasks the pretrained base and
            the demo's adapter never saw, :data:`UNSEEN_PATH`).
        window: Frames per clip.
        split: ``"train"``, ``"val"`` or ``"all"``.
        stride: Frames between the starts of consecutive clips (default: ``window``).
        size: ``(H, W)`` to resize LeRobot frames to (an HDF5 file must hold that size).
        tasks: The Meta-World tasks to keep (None: all).
        camera: A LeRobot dataset's video feature.
        control: Adds a control video derived from each clip (``edges``, see :mod:`workbench.data.control`).
        **options: Go into a LeRobot dataset's config (``actions``, ``state``, ``ee_pos``, ``fps``; see
            :func:`data_options`).

    Returns:
        The clip dataset.
    """
    from workbench.data.sources import data_kind, open_clips

    path = str(UNSEEN_PATH) if path == "unseen" else path
    if options and data_kind(path) != "lerobot":
        raise DataError(f"{', '.join(f'--{k}' for k in options)}: {path} is a Meta-World file, "
                        f"whose actions and state its schema fixes; "
                        f"these options choose the features of a LeRobot dataset. Leave them out.")
    if tasks:
        if data_kind(path) == "lerobot":
            raise DataError(f"--tasks {','.join(tasks)} picks tasks of a Meta-World file, "
                            f"but {path} is a LeRobot dataset. "
                            f"Leave --tasks out (every episode of the split is evaluated).")
        options["tasks"] = tasks
    if camera:
        options["camera"] = camera
    if control:
        options["control"] = control
    if data_kind(path) == "lerobot":
        from workbench.data.lerobot_format import LeRobotMeta

        if "ee_pos" not in options and "observation.ee_pos" in LeRobotMeta(path).features:
            options["ee_pos"] = "observation.ee_pos"  # what the action error needs (Meta-World's)
    return open_clips(path, window=window, stride=stride or window, split=split, size=size, **options)


def spread_over_tasks(source, n: int) -> list[int]:
    """``n`` clip indices of ``source`` taken in turn from each task, and within a task in turn from each
    of its episodes (each episode's clips in order), so a few clips still cover every task and come from
    several episodes (the swapped actions of (c) need two); the order of the source when it does not say
    its tasks.

    A source says its tasks through ``index`` (``(episode, start)`` per clip) and ``task_names``
    (per episode), as :class:`~workbench.data.metaworld.MetaWorldClips` and
    :class:`~workbench.data.lerobot.LeRobotClips` do.
    """
    index, names = getattr(source, "index", None), getattr(source, "task_names", None)
    if index is None or names is None:
        return list(range(n))
    by_task: dict[str, dict[int, list[int]]] = {}
    for i, (episode, _) in enumerate(index):
        by_task.setdefault(names[episode], {}).setdefault(episode, []).append(i)
    queues = []
    for episodes in by_task.values():  # a task's clips: the first of each episode, then the second, ...
        clips = list(episodes.values())
        queues.append([c[k] for k in range(max(map(len, clips))) for c in clips if k < len(c)])
    chosen: list[int] = []
    while len(chosen) < n:
        for queue in queues:
            if queue and len(chosen) < n:
                chosen.append(queue.pop(0))
    return sorted(chosen)


def swap_partner(episodes: list[int]) -> list[int]:
    """For each clip, the index of a clip from another episode whose actions it borrows in (c).

    The partner is the next clip (cyclically) that belongs to a different episode, so every
    clip gets real, recorded actions that belong to someone else.
    """
    n = len(episodes)
    out = []
    for i in range(n):
        j = next((k % n for k in range(i + 1, i + n) if episodes[k % n] != episodes[i]), None)
        if j is None:
            raise DataError(f"Swapping actions needs clips from at least two episodes; "
                            f"all {n} clips come from episode {episodes[i]}. "
                            f"Evaluate on more episodes (e.g. the whole val split).")
        out.append(j)
    return out


def json_safe(x: Any) -> Any:
    """``x`` with non-finite floats (NaN, inf) as None, so JSON can hold it."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    return None if isinstance(x, float) and not np.isfinite(x) else x


__all__ = ["UNSEEN_PATH", "clip_source", "data_options", "json_safe", "load_run", "run_data",
           "spread_over_tasks", "swap_partner"]


def check_signals(exp, source, data: str) -> None:
    """The clips serve every per-frame signal the adapter reads, at the width it was trained with; a
    DataError before any prediction otherwise, with the fix."""
    widths = source.widths() if hasattr(source, "widths") else {}
    if not widths:
        return
    flags = {"action": "--actions", "proprio": "--state"}
    for c in exp.model.adapter.consumes:
        if c.video or not c.required:
            continue
        found = [key for key in c.keys if key in widths]
        if not found:
            if c.name in flags:
                raise DataError(f"The run's adapter reads {c.name!r}, which the clips of {data} do not serve "
                                f"(they serve {', '.join(sorted(widths))}). Nothing was evaluated. "
                                f"Evaluate on data that records it, "
                                f"or name its feature with {flags[c.name]} FEATURE.")
            continue
        width = widths[found[0]]
        if c.dim is not None and width != c.dim:
            raise DataError(
                f"The run's adapter was trained on {c.dim}-D {c.name!r} vectors, "
                f"but the clips of {data} serve {width}-D ones. Nothing was evaluated. "
                f"Evaluate it on data with {c.dim}-D {c.name} vectors "
                f"(or choose such a feature with {flags.get(c.name, '--actions')} FEATURE), "
                f"or train an adapter for this data: "
                f"`workbench train CONFIG --action-dim {width}` with a data: block that reads {data}.")


def action_error_scorable(items: list[dict], video: np.ndarray, probe: Any = None) -> str | None:
    """``None`` when the action error can be scored on these clips; else why not, in words (it is then NaN).

    It needs the recorded hand position (``ee_pos``) of every clip, and frames the hand probe reads
    (its square size, e.g. 64x64 Meta-World ``corner2`` frames).
    """
    if not all("ee_pos" in it for it in items):
        return "not scored: the clips carry no recorded hand position (ee_pos)"
    from workbench.worldmodel.probe import shipped_probe

    size = (probe or shipped_probe()).image_size
    if tuple(video.shape[-3:-1]) != (size, size):
        return (f"not scored: the hand probe reads {size}x{size} frames, these are {video.shape[-3]}x"
                f"{video.shape[-2]}")
    return None
