"""The stored notebooks, as a reader sees them: executed top to bottom, pictures as PNG, no
errors or warnings in the outputs, no widget that needs a live kernel. (``make test`` also
re-executes them under strict nbval, which compares every text output.)"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NUMBERED = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def outputs(path: Path) -> list[dict]:
    return [o for c in cells(path) if c["cell_type"] == "code" for o in c.get("outputs", [])]


def test_there_are_numbered_notebooks():
    assert [p.name[:2] for p in NUMBERED][:4] == ["01", "02", "03", "04"]
    assert "06_diffusers_backbone.ipynb" in [p.name for p in NUMBERED]


@pytest.mark.parametrize("path", NUMBERED, ids=lambda p: p.stem)
def test_stored_in_order_with_pictures_and_nothing_on_stderr(path):
    code = [c for c in cells(path) if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))  # one clean run, in order
    outs = outputs(path)
    assert not [o for o in outs if o["output_type"] == "error"]
    assert not [o for o in outs if o["output_type"] == "stream" and o["name"] == "stderr"]  # no warnings
    assert sum("image/png" in o.get("data", {}) for o in outs) >= 2
    assert not [o for o in outs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert "widgets" not in json.loads(path.read_text())["metadata"]


VIEWS = ("Stepper", "AblationSliders", "Fit", "ConditionProbe", "Gates", "ActionSensitivity", "Drive")


@pytest.mark.parametrize("path", NUMBERED, ids=lambda p: p.stem)
def test_every_view_output_carries_its_picture_and_status(path):
    """Opened without a kernel (JupyterLab, GitHub, nbviewer), each view shows its last picture and line."""
    shown = [o for o in outputs(path) if "".join(o.get("data", {}).get("text/plain", "")).startswith(
        tuple(f"{v}: " for v in VIEWS))]
    for output in shown:
        data = output["data"]
        assert "image/png" in data and len(data["image/png"]) > 1000, "".join(data["text/plain"])[:80]
        assert sorted(data) == ["image/png", "text/plain"]  # no widget view that would need its model
    if path.stem[:2] in ("01", "02", "03", "04"):
        assert shown  # the notebooks of the instruments display views


@pytest.mark.parametrize("path", NUMBERED, ids=lambda p: p.stem)
def test_one_torch_thread_and_listed_in_the_readme(path):
    first = "".join(next(c for c in cells(path) if c["cell_type"] == "code")["source"])
    assert 'os.environ.setdefault("OMP_NUM_THREADS", "1")' in first and "torch.set_num_threads(1)" in first
    assert f"]({path.name})" in (NOTEBOOKS / "README.md").read_text()


def execute_tool():
    spec = importlib.util.spec_from_file_location("execute", NOTEBOOKS.parent / "tools" / "execute_notebooks.py")
    execute = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(execute)
    return execute


@pytest.mark.parametrize("path", NUMBERED, ids=lambda p: p.stem)
def test_stored_with_the_kernelspec_jupyterlab_writes(path):
    """Opened in JupyterLab, a notebook stored with another kernel display name is rewritten: marked modified."""
    pytest.importorskip("jupyter_client")
    expected = execute_tool().kernelspec()
    assert json.loads(path.read_text())["metadata"]["kernelspec"] == expected


def test_storing_keeps_the_picture_and_drops_the_live_widget():
    execute = execute_tool()
    import nbformat

    nb = nbformat.v4.new_notebook()
    view = {"application/vnd.jupyter.widget-view+json": {"model_id": "x"}, "image/png": "iVBOR", "text/plain": "V"}
    bare = {"application/vnd.jupyter.widget-view+json": {"model_id": "y"}, "text/plain": "W"}
    nb.cells = [nbformat.v4.new_code_cell("v", outputs=[nbformat.v4.new_output("display_data", data=view),
                                                         nbformat.v4.new_output("display_data", data=bare)])]
    nb.metadata["widgets"] = {"state": {}}
    execute.keep_static(nb)
    first, second = nb.cells[0].outputs
    assert sorted(first.data) == ["image/png", "text/plain"]
    assert "application/vnd.jupyter.widget-view+json" in second.data  # nothing else to show: kept
    assert "widgets" not in nb.metadata
