"""Rough edges a new user hits: the version, help texts, refusals before work, the report's training figure,
the precursor tables on a terminal."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import geolens
from geolens.cli import app

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _help(*command: str, columns: int = 80) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": str(columns), "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())  # the help's words, frames and wraps dropped


def test_version():
    from importlib.metadata import version

    assert geolens.__version__ == version("geolens")
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"geolens {geolens.__version__}"


def test_task_help_keeps_its_brackets():
    text = _help("train")
    assert "add3 (Z_p sums of 3 operands, [a, b, c, =]) (default add)." in text
    assert "operands, )" not in text


def test_train_help_shows_the_defaults():
    text = _help("train")
    for option, default in (("--p", "113"), ("--lr", "0.0006"), ("--epochs", "5000"), ("--frac", "0.3")):
        assert f"(default {default})." in text.split(f" {option} <")[1].split(" --")[0], option


@pytest.mark.parametrize("columns", [80, 120])
def test_sweep_out_help_is_not_cut_off(columns):
    text = _help("sweep", columns=columns)
    assert "…" not in text.split("--grid")[0]
    assert "e.g. OUT/fb/lr6e-4/seed_1 (with task, p and wd levels where those vary; docs/cli.md)." in text


def test_cli_doc_lists_add3_and_the_deep_engines():
    doc = (DOCS / "cli.md").read_text()
    assert "`add3` (Z_p sums of three operands" in doc
    assert "`deep` (the exact forward of every depth" in doc and "`batched-deep`" in doc
    assert "| `--columns a,b` | only these columns (needs `--online`;" in doc


def test_sweep_with_an_engine_that_cannot_run_the_model_is_refused_before_training(tmp_path):
    from geolens.errors import GeoError
    from geolens.sweeps.grid import make_grid
    from geolens.sweeps.sweep import run_sweep

    flags = dict(presets="ln", seeds="1-3", p="23", epochs="20")
    grid = make_grid(None, flags, ["n_layers=2", "engine=fast", "d_model=32", "d_head=8", "d_mlp=64"])
    with pytest.raises(GeoError, match=r"^member seed_1: engine=fast cannot run this model: .*; use --set "
                                       r"engine=auto or engine=hooked$"):
        run_sweep(grid, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_precursors_refuses_an_unknown_column(tmp_path):
    from geolens.errors import GeoError
    from geolens.outputs.precursor_table import check_columns

    run = SimpleNamespace(metrics=[{"epoch": 0, "train_loss": 1.0, "test_loss": 2.0, "wl_gini": 0.1}])
    groups = [SimpleNamespace(runs=[run])]
    check_columns(groups, ["wl_gini", "loss_gap"])
    check_columns(groups, None)
    with pytest.raises(GeoError, match=r"^--columns bogus: not recorded by these runs; their columns are .*wl_gini"):
        check_columns(groups, ["wl_gini", "bogus"])


def test_training_figure_names_train_and_test_once_and_its_event_labels_point_apart():
    from geolens.outputs.plots import to_plotly
    from geolens.outputs.report import fig_training

    rows = [dict(epoch=e, train_loss=1 / (e + 1), test_loss=2 / (e + 1), train_acc=min(1, e / 100),
                 test_acc=min(1, e / 200)) for e in range(0, 300, 10)]
    traj = SimpleNamespace(run=SimpleNamespace(metrics=rows, events={"onset_095": 190, "sustained_099": 200}))
    fig = to_plotly(fig_training(traj))
    named = [d.name for d in fig.data if d.showlegend]
    assert sorted(named) == ["test", "train"]
    # the two event lines are 10 epochs apart: the earlier one's label reads leftwards, the later one's rightwards
    labels = [(a.x, a.xanchor, a.xref) for a in fig.layout.annotations if a.xref in ("x", "x2")]
    assert sorted(labels) == [(190, "right", "x"), (190, "right", "x2"), (200, "left", "x"), (200, "left", "x2")]


def test_precursor_tables_fit_the_terminal_and_say_no_onset(monkeypatch):
    import io

    from rich.console import Console

    from geolens import cli
    from geolens.outputs.precursor_table import COLUMNS

    screen = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=screen, width=100, force_terminal=True, markup=False))
    row = {c: f"{c} value" for c in COLUMNS} | {"configuration": "sphere lr 0.0006 wd 1, add p=113"}
    cli._print_rows("runs: precursors of the onset (onset_095)", COLUMNS, [row, row], ["a note"])
    lines = re.sub(r"\x1b\[[0-9;]*m", "", screen.getvalue()).splitlines()
    assert max(len(x) for x in lines) <= 100 and "  - a note" in lines
    screen.truncate(0)
    screen.seek(0)
    cli._print_rows("runs: online rules", COLUMNS, [], ["sphere lr 0.0006 wd 1, add p=113: no run has an onset; "
                                                        "nothing to forecast"])
    text = re.sub(r"\x1b\[[0-9;]*m", "", screen.getvalue())
    assert "runs: online rules: no onset, nothing to tabulate" in text and "┏" not in text and "no run has an onset" in text
