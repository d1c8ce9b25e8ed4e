"""The optional extras of the distribution, and checking for one before a command starts work.

``pip install .`` in a clone of the repository brings what the library's core needs (torch, numpy, PyYAML,
safetensors, tqdm): building and training adapters on the embedded model, ``workbench train``
on the synthetic data, ``workbench doctor``. Each extra adds the packages of a use:

* ``data`` — h5py, metaworld, imageio, imageio-ffmpeg, pillow, pyarrow, av (and packaging, which
  Meta-World's renderer imports without declaring it): the Meta-World HDF5 and LeRobot datasets,
  ``workbench data``, ``eval``, ``demo``, ``pretrain``, ``probe``, writing videos;
* ``widgets`` — ipywidgets, anywidget, matplotlib, ipykernel: the notebook views, ``workbench demo``'s loss
  chart;
* ``peft`` — peft: ``lora`` adapters (and ``lora:`` blocks);
* ``diffusers`` — diffusers, transformers, accelerate, sentencepiece, ftfy: the diffusers backbone plugins;
* ``logging`` — tensorboard: the ``tensorboard`` callback.

:func:`require` checks that an extra's modules can be imported (without importing them) and
raises a :class:`MissingExtraError` naming the extra and the ``pip`` command otherwise. The
distribution is not on the package index yet, so every message names the command that works in a
clone (:func:`install_hint`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping

from workbench.errors import WorkbenchError

#: extra → {distribution name: module it provides}; tests check it against pyproject.toml.
EXTRAS: dict[str, dict[str, str]] = {
    "data": {"h5py": "h5py", "metaworld": "metaworld", "imageio": "imageio",
             "imageio-ffmpeg": "imageio_ffmpeg", "pillow": "PIL", "pyarrow": "pyarrow", "av": "av",
             "packaging": "packaging"},
    "widgets": {"ipywidgets": "ipywidgets", "anywidget": "anywidget", "matplotlib": "matplotlib",
                "ipykernel": "ipykernel"},
    "peft": {"peft": "peft"},
    "diffusers": {"diffusers": "diffusers", "transformers": "transformers", "accelerate": "accelerate",
                  "sentencepiece": "sentencepiece", "ftfy": "ftfy"},
    "logging": {"tensorboard": "tensorboard"},
}

#: extra → what it serves, in words (``workbench doctor`` prints it beside the commands that need it).
SERVES: dict[str, str] = {
    "data": "datasets and video files: the metaworld and lerobot datasets, importing your own videos, "
            "MP4 / GIF output",
    "widgets": "the notebook views (workbench.widgets: Stepper, Fit, ...) and the demo's loss chart",
    "peft": "lora adapters and lora: blocks inside action_modulation",
    "diffusers": "the diffusers backbone plugins (wan22_ti2v, easyanimate, dynamicrafter)",
    "logging": "the tensorboard callback",
}


class MissingExtraError(WorkbenchError, ImportError):
    """An optional package a command or component needs is not installed; the message names the extra."""


#: Modules an extra brings through its packages' own dependencies (metaworld brings mujoco).
BROUGHT = {"mujoco": "data", "gymnasium": "data", "tensorboard": "logging"}


def extra_of(module: str) -> str | None:
    """The extra that provides the top-level module ``module`` (``"h5py"`` → ``"data"``), or None."""
    root = module.split(".")[0]
    if root in BROUGHT:
        return BROUGHT[root]
    for extra, provides in EXTRAS.items():
        if root in provides.values():
            return extra
    return None


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (looked up, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def distribution_version(dist: str) -> str:
    """The installed version of distribution ``dist``, or ``"unknown"`` (recorded in the files the
    simulator makes, beside the data)."""
    import importlib.metadata as metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def missing(extra: str, modules: Iterable[str] | None = None) -> list[str]:
    """The modules of ``extra`` (or just ``modules`` of it) that cannot be imported here."""
    wanted = list(modules) if modules is not None else list(EXTRAS[extra].values())
    return [m for m in wanted if not installed(m)]


def install_command(extras: Iterable[str]) -> str:
    """The ``pip`` command that adds ``extras`` to an install made from a clone of the repository.

    Args:
        extras: Names of extras, e.g. ``["data", "widgets"]``; repeats are dropped and the rest sorted.

    Returns:
        The command as a user types it in the clone's root, e.g. ``pip install "./[data,widgets]"``.
    """
    names = ",".join(sorted(set(extras)))
    return f'pip install "./[{names}]"'


def install_hint(extras: Iterable[str]) -> str:
    """The install advice every missing-extra message ends with: :func:`install_command`, where to run it,
    and its editable form.

    Args:
        extras: Names of the missing extras.

    Returns:
        One line, e.g. ``pip install "./[data]" in a clone of the repository (pip install -e "./[data]" for
        an editable install; `make install` there installs every extra)``.
    """
    command = install_command(extras)
    return (f"{command} in a clone of the repository ({command.replace('install ', 'install -e ', 1)} for an "
            f"editable install; `make install` there installs every extra)")


def require(extra: str, *, what: str, modules: Iterable[str] | None = None) -> None:
    """Raise :class:`MissingExtraError` unless the modules of ``extra`` (default: all of them) can be
    imported. ``what`` names who needs them, e.g. ``"workbench demo"`` or ``"the metaworld dataset"``."""
    absent = missing(extra, modules)
    if absent:
        raise MissingExtraError(
            f"{what} needs {', '.join(absent)} from the '{extra}' extra, which is not installed in this "
            f"environment. Install it with: {install_hint([extra])}."
        )


def require_all(needs: Mapping[str, Iterable[str]], what: str) -> None:
    """Check every extra in ``needs`` (extra → modules) at once, naming all that are missing together."""
    absent = {extra: missing(extra, modules) for extra, modules in needs.items()}
    absent = {extra: mods for extra, mods in absent.items() if mods}
    if absent:
        which = "; ".join(f"{', '.join(mods)} (the '{extra}' extra)" for extra, mods in absent.items())
        raise MissingExtraError(f"{what} needs {which}, not installed in this environment. Install with: "
                                f"{install_hint(absent)}.")


def missing_module_error(err: ImportError, what: str) -> MissingExtraError | None:
    """A :class:`MissingExtraError` for an ImportError of a module an extra provides (else None)."""
    name = getattr(err, "name", None) or ""
    extra = extra_of(name) if name else None
    if extra is None:
        return None
    return MissingExtraError(f"{what} needs the module {name.split('.')[0]!r} from the '{extra}' extra, "
                             f"which is not installed in this environment. "
                             f"Install it with: {install_hint([extra])}.")
