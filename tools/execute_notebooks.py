"""Execute the numbered notebooks in place and store outputs that every notebook viewer shows.

    python tools/execute_notebooks.py          # every numbered notebook (what `make notebooks` runs)
    python tools/execute_notebooks.py 02 03    # those whose names start with 02 or 03

Each notebook runs top to bottom in a fresh kernel of this Python environment, from the
``notebooks/`` folder, with one torch thread, and its execution time is printed. A view
displays as a live widget, a PNG and a text line; a widget lives only while its kernel runs,
so the stored file keeps the PNG and the text (GitHub, nbviewer and JupyterLab without a
kernel then show the picture). Running the notebook again brings the widgets back.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parents[1] / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def keep_static(nb: nbformat.NotebookNode) -> None:
    """Drop widget views that have a static picture beside them, and the saved widget state."""
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW in data and "image/png" in data:
                del data[WIDGET_VIEW]
    nb.metadata.pop("widgets", None)


def kernelspec(name: str = "python3") -> dict[str, str]:
    """The notebook metadata of the kernel that runs the notebooks, as JupyterLab writes it when it opens one.

    Stored any other way (an older display name), opening a notebook rewrites it and marks the file modified.
    """
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec(name)
    return {"display_name": spec.display_name, "language": spec.language, "name": name}


def execute(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                   store_widget_state=False, record_timing=False).execute()
    seconds = time.perf_counter() - started
    keep_static(nb)
    nb.metadata["kernelspec"] = kernelspec()
    nbformat.write(nb, path)
    return seconds


def main(prefixes: list[str]) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"  # the kernels inherit it
    paths = sorted(p for p in HERE.glob("[0-9]*.ipynb") if not prefixes or p.name.startswith(tuple(prefixes)))
    if not paths:
        sys.exit(f"No numbered notebook in {HERE} matches {prefixes}.")
    for path in paths:
        print(f"{path.name}: executed in {execute(path):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
