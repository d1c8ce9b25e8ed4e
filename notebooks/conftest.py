"""Under ``pytest --nbval`` the notebooks run the pretrained ``tiny_video``, notebook 6 the
diffusers backbone plugins and notebook 7 the DynamiCrafter plugin: a notebook whose requirements
are not installed is skipped with the reason (and the fix) instead of failing."""

from __future__ import annotations

import importlib.metadata as metadata
from pathlib import Path

import pytest

from workbench.backbones.tiny_video import WEIGHTS_DIR

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


def pytest_collection_modifyitems(config, items):
    reasons: dict[str, str | None] = {}
    for item in items:
        path = Path(str(item.fspath))
        if path.suffix != ".ipynb":
            continue
        if path.name not in reasons:
            reasons[path.name] = _skip_reason(path.name)
        if reasons[path.name] is not None:
            item.add_marker(pytest.mark.skip(reason=reasons[path.name]))
