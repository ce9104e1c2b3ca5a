"""The notebooks in notebooks/ run top to bottom, and are stored without outputs.

Each notebook is executed with nbclient in a fresh kernel of the interpreter running pytest
(ipykernel's native "python3" kernel, never a kernelspec found elsewhere on the machine), with
a timeout per cell; any error in any cell fails the test. The stored files must not carry
outputs or execution counts, so diffs stay readable and results never go stale in the repo.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXPECTED = {"01_quickstart.ipynb", "02_100k_or_100_days.ipynb", "03_calibrate_your_gpu.ipynb"}
CELL_TIMEOUT_S = 300  # per cell; the whole of 01 + 02 takes well under a minute
NEEDS_TORCH = {"03_calibrate_your_gpu.ipynb"}  # measures the local device with torch


def _ids(paths):
    return [p.stem for p in paths]


def test_expected_notebooks_present():
    assert EXPECTED <= {p.name for p in NOTEBOOKS}, f"missing in {NOTEBOOK_DIR}: {EXPECTED - {p.name for p in NOTEBOOKS}}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_stored_without_outputs(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    dirty = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        if cell.get("outputs"):
            dirty.append(f"cell {i}: has outputs")
        if cell.get("execution_count") is not None:
            dirty.append(f"cell {i}: execution_count {cell['execution_count']}")
        if "execution" in cell.get("metadata", {}):
            dirty.append(f"cell {i}: execution timing metadata")
    assert not dirty, (f"{path.name} is stored with outputs ({'; '.join(dirty)}); clear them before "
                       "committing (see notebooks/README.md)")


def _kernel_manager():
    """A kernel manager for ipykernel's native kernel of *this* interpreter.

    ``kernel_dirs=[]`` ignores kernelspecs installed in user or system Jupyter paths (a
    ``python3`` spec there may point at another interpreter without this package); the
    native spec's argv is ``sys.executable -m ipykernel_launcher``.
    """
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    return KernelManager(kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))


def _missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def _params():
    # 03 calibrates the machine running the tests: tens of seconds even in its fast mode
    return [pytest.param(p, id=p.stem, marks=[pytest.mark.slow] if p.name in NEEDS_TORCH else [])
            for p in NOTEBOOKS]


@pytest.mark.parametrize("path", _params())
def test_notebook_runs(path: Path, monkeypatch):
    missing = _missing("nbformat", "nbclient", "ipykernel", "matplotlib")
    if missing:
        pytest.fail(f"the notebook tests need {', '.join(missing)} in this interpreter: "
                    "pip install nbformat nbclient ipykernel matplotlib")
    if path.name in NEEDS_TORCH and _missing("torch"):
        pytest.skip(f"{path.name} measures the local device with torch: pip install -e '.[calibration]'")
    # the kernel inherits this environment: 03 runs its smallest calibration and validation
    monkeypatch.setenv("SIMULATOR_NOTEBOOK_FAST", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, km=_kernel_manager(), timeout=CELL_TIMEOUT_S, startup_timeout=120,
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    t0 = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as exc:
        pytest.fail(f"{path.name} failed:\n{exc}", pytrace=False)
    print(f"{path.name}: {time.perf_counter() - t0:.1f} s")
