"""Every notebook in analyses/ runs as shipped: executed with nbclient in a fresh kernel, from a
working directory outside the repository, on the trajectories shipped in checkpoints/. Each test
checks values the notebook prints, and that it wrote nothing into checkpoints/ (its outputs go to a
temporary folder, here under tmp_path)."""

import os
import re
import sys
from pathlib import Path

import pytest
from conftest import REPO

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted(p.stem for p in (REPO / "analyses").glob("*.ipynb"))
# appended to each notebook before it runs: which interpreter and which geolens the kernel used
WHERE = "import sys, geolens\nprint('kernel python:', sys.executable)\nprint('kernel geolens:', geolens.__file__)"


def tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


def execute(name: str, tmp_path: Path, monkeypatch) -> tuple[str, int]:
    """Run analyses/NAME.ipynb from tmp_path; returns (all printed text, number of images shown)."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    # the kernel imports this checkout, writes its temporary files under tmp_path, and finds the
    # trajectories from the package's location (no GEOLENS_CHECKPOINTS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MPLBACKEND", "agg")
    monkeypatch.delenv("GEOLENS_CHECKPOINTS", raising=False)
    book = nbformat.read(REPO / "analyses" / f"{name}.ipynb", as_version=4)
    assert all(not c.get("outputs") for c in book.cells if c.cell_type == "code"), f"{name}: outputs are not cleared"
    book.cells.append(nbformat.v4.new_code_cell(WHERE))
    shipped = REPO / "checkpoints"
    before = tree(shipped)
    # kernel_name python3 is ipykernel's own spec: jupyter_client starts it with this interpreter
    client = nbclient.NotebookClient(book, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(work)}})
    client.execute()
    assert tree(shipped) == before, f"{name} wrote into checkpoints/"
    text, images = [], 0
    for cell in book.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                text.append(out.text)
            elif out.output_type in ("execute_result", "display_data"):
                images += "image/png" in out.data
                text.append(out.data.get("text/plain", ""))
    printed = "".join(text)
    assert f"kernel python: {sys.executable}" in printed or Path(sys.executable).resolve().as_posix() in printed
    assert f"kernel geolens: {REPO / 'geolens' / '__init__.py'}" in printed
    assert list(tmp_path.glob("geolens-notebook-*")), f"{name} did not write into its temporary folder"
    return printed, images


def number(text: str, pattern: str) -> float:
    m = re.search(pattern, text)
    assert m, f"no {pattern!r} in the notebook's output:\n{text}"
    return float(m.group(1))


def check_quickstart(out: str, images: int) -> None:
    assert "tokens: ['17', '42', '=']" in out and "logits shape: (1, 3, 113)" in out
    assert number(out, r"test accuracy at epoch \d+: ([\d.]+)") >= 0.99
    assert number(out, r"MLP output at '=' zeroed: ([\d.]+)") < 0.5
    # patching the second operand's stream restores the clean run exactly; the shared tokens nothing
    assert number(out, r"position 1 \(42\): restored ([-\d.]+)") == pytest.approx(1.0, abs=1e-3)
    assert number(out, r"position 0 \(17\): restored ([-\d.]+)") == pytest.approx(0.0, abs=1e-3)
    assert number(out, r"position 2 \(=\): restored ([-\d.]+)") == pytest.approx(0.0, abs=1e-3)
    assert number(out, r"MLP output at '=' patched: restored ([-\d.]+)") > 0.8  # the MLP carries most of it


def check_circuit_at_step(out: str, images: int) -> None:
    assert number(out, r"accuracy: train [\d.]+, test ([\d.]+)") >= 0.99
    keys = [int(k) for k in re.search(r"key frequencies: \[([\d, ]+)\]", out).group(1).split(",")]
    assert keys and all(1 <= k <= 56 for k in keys)
    assert number(out, rf"FVE k={keys[0]}: U ([\d.]+)%") == number(out, r"strongest key frequency \d+: FVE of U ([\d.]+)%")
    assert re.search(r"verdict: (clock|pizza|mixed)", out)
    assert number(out, r"correct logit: max error ([-\d.e+]+)") < 1e-3
    assert number(out, r"neuron-level parts vs the logits: max error ([-\d.e+]+)") < 1e-3
    assert number(out, r"probe.dla reconstruction error: ([-\d.e+]+)") < 1e-3
    assert images == 1


def check_wl_spectrum(out: str, images: int) -> None:
    for preset in ("ln", "fb"):
        assert number(out, rf"{preset}: epoch \d+, test acc ([\d.]+)") >= 0.99
        assert number(out, rf"{preset}: epoch .*shares sum to ([\d.]+)") == pytest.approx(1.0, abs=1e-3)
        assert number(out, rf"{preset}: raw non-DC W_L energy ([\d.e+-]+)") > 0
    assert images == 1


def check_clock_vs_pizza(out: str, images: int) -> None:
    for name in ("fb", "ln"):
        assert number(out, rf"{name}: \d+ checkpoints, (\d+) metric values computed") == 0  # all from the cache
        assert re.search(rf"final verdict {name}: (clock|pizza|mixed) \(epoch \d+\)", out)
    assert images == 2


def check_tl_progress_measures(out: str, images: int) -> None:
    chance = number(out, r"ln\(p\) = ([\d.]+)")
    for name, steps in (("fb", (1000, 2710)), ("ln", (6000, 8960))):
        m = {}
        for step in steps:
            block = re.search(rf"{name} epoch {step}:.*\n.*\n.*\n", out).group(0)
            for kind, key in (("restricted", r"restricted \(test\)"), ("excluded", r"excluded \(train\)")):
                for way in ("hook", "geolens", "TL shortcut"):
                    m[step, kind, way] = number(block, rf"{key}: .*{way} ([\d.]+)")
            # the TL shortcut's logits are on the wrong scale: chance when restricted, ~nothing removed when excluded
            assert abs(m[step, "restricted", "TL shortcut"] - chance) < 0.3
            assert m[step, "excluded", "TL shortcut"] < 0.25
        first, final = steps[0], steps[-1]
        for way in ("hook", "geolens"):  # restricting to the key frequencies works better once the circuit forms
            assert m[final, "restricted", way] < m[first, "restricted", way]
        assert m[final, "excluded", "hook"] > 1.0  # removing the key frequencies the hook way breaks the model
    assert number(out, r"fb logit lens with model.W_U: max error ([-\d.e+]+)") < 1e-4
    assert number(out, r"fb logit lens with model.unembed.W_U: max error ([\d.]+)") > 1.0
    assert number(out, r"fb resid_mid \+ mlp_out vs resid_post: max error ([\d.]+)") > 0.1


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_as_shipped(name, tmp_path, monkeypatch):
    check = globals().get(f"check_{name}")
    assert check, f"analyses/{name}.ipynb has no check_{name} in tests/test_notebooks.py"
    check(*execute(name, tmp_path, monkeypatch))


def test_the_notebooks_are_there():
    assert {"quickstart", "circuit_at_step", "wl_spectrum", "clock_vs_pizza", "tl_progress_measures"} <= set(NOTEBOOKS)
