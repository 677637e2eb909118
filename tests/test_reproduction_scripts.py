"""analyses/reproduction's scripts on tiny runs: what they copy and the section 4.3 table they write."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from geolens import load_run
from geolens.model.config import make_config
from geolens.runs.storage import load_tensors, save_tensors
from geolens.training import train as training

SCRIPTS = Path(__file__).resolve().parent.parent / "analyses" / "reproduction"
SMALL = dict(p=23, frac_train=0.5, d_model=32, n_heads=4, d_head=8, d_mlp=64, lr=1e-3, epochs=40, eval_every=10)


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    for preset in ("fb", "ln"):
        training.train(make_config(preset, seed=42, **SMALL), root / preset / "seed_42", progress=False)
    return root


def test_collect_copies_the_records_of_finished_runs_only(runs, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(runs, src)
    shutil.copytree(src / "fb" / "seed_42", src / "fb" / ".seed_43.geolens-new-1")  # a run being built
    header = json.loads((src / "ln" / "seed_42" / "run.json").read_text())
    (src / "ln" / "seed_42" / "run.json").write_text(json.dumps({**header, "status": "running"}))
    assert script("collect").collect(src, tmp_path / "out") == 1
    copied = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert copied == ["fb/seed_42/events.json", "fb/seed_42/metrics.csv", "fb/seed_42/run.json"]


def test_spectral_table_rows_are_the_last_checkpoints_metrics_next_to_the_paper(runs, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(runs, src)
    script("spectral").main(src, tmp_path / "results", tmp_path / "tables")
    rows = [line.split(" | ") for line in (tmp_path / "tables" / "spectral.md").read_text().splitlines()
            if line.startswith("| fb ") or line.startswith("| ln ")]
    assert [r[0] for r in rows] == ["| fb", "| ln"]
    for row, preset in zip(rows, ("fb", "ln")):
        run = load_run(src / preset / "seed_42")
        step = run.steps[-1]
        fve = run.analyze(["fve_paper"], steps=[step]).values[step]["fve_paper"]
        assert row[2] == f"{step:,}"
        assert row[5] == f"{fve['fve_paper_U_max']:.2f} / {fve['fve_paper_V_max']:.2f}"
        assert (tmp_path / "results" / preset / "seed_42" / "analysis" / "metrics.csv").is_file()
    assert rows[0][6] == "U 62.55% / V 48.43%" and rows[0][8] == "0.9996"  # the paper's, from paper_tables.json
    # a run that records no commit (or an uncommitted tree) is named in the table's notes
    header = json.loads((src / "ln" / "seed_42" / "run.json").read_text())
    (src / "ln" / "seed_42" / "run.json").write_text(json.dumps({**header, "segments": []}))
    script("spectral").main(src, tmp_path / "results", tmp_path / "tables")
    text = (tmp_path / "tables" / "spectral.md").read_text()
    assert "Notes:" in text and "runs record no commit" in text and "ln/seed_42" in text.split("Notes:")[1]
    assert rows[1][6] == "up to ~54%" and rows[1][8] == "0.9998"


def test_embed_tables_refreshes_each_block_from_its_table(tmp_path):
    embed = script("embed_tables")
    (tmp_path / "t.md").write_text("intro\n\n| row | n |\n| --- | --- |\n| a lr 1 | 3 |\n| b lr 2 | 4 |\n| c lr 1 | 5 |\n")
    doc = ("text\n<!-- table: t.md | lr 1 -->\nstale\n<!-- /table -->\nmiddle\n"
           "<!-- table: t.md -->\n<!-- /table -->\nend\n")
    out, count = embed.embed(doc, root=tmp_path)
    assert count == 2
    assert out == ("text\n<!-- table: t.md | lr 1 -->\n| row | n |\n| --- | --- |\n| a lr 1 | 3 |\n| c lr 1 | 5 |\n"
                   "<!-- /table -->\nmiddle\n<!-- table: t.md -->\n| row | n |\n| --- | --- |\n| a lr 1 | 3 |\n"
                   "| b lr 2 | 4 |\n| c lr 1 | 5 |\n<!-- /table -->\nend\n")
    assert embed.embed(out, root=tmp_path) == (out, 2)  # refreshing again changes nothing
    with pytest.raises(SystemExit, match="missing.md does not exist"):
        embed.embed("<!-- table: missing.md -->\n<!-- /table -->\n", root=tmp_path)


def test_the_reproduction_doc_shows_the_committed_tables():
    doc = SCRIPTS.parent.parent / "docs" / "reproduction.md"
    text = doc.read_text()
    refreshed, count = script("embed_tables").embed(text)
    assert count >= 2 and refreshed == text  # rerun analyses/reproduction/embed_tables.py after `geolens table`


def test_every_reproduction_grid_expands_and_run_cpu_runs_each(tmp_path):
    """Each name run_cpu.sh runs is a grid file or a script of its own; each grid file expands into
    members (an unknown preset or key, or a bad value, fails here rather than hours into a run)."""
    import re

    from geolens.sweeps.grid import expand, make_grid, resolve_layout

    names = re.search(r"grids=\((table1[^)]*)\)", (SCRIPTS / "run_cpu.sh").read_text()).group(1).split()
    assert "table1_lr6e-4" in names and all((SCRIPTS / f"{n}.toml").exists() != (SCRIPTS / f"{n}.sh").exists()
                                            for n in names)
    for path in sorted(SCRIPTS.glob("*.toml")):
        grid = make_grid(path)
        members = expand(grid, tmp_path / path.stem, resolve_layout(grid, tmp_path / path.stem))
        seeds = {m.cfg.seed for m in members}
        assert len(seeds) >= (3 if path.stem.startswith(("table", "appendix")) else 1), path.name  # tables: >= 3 seeds


def test_figures_sh_rebuilds_every_figure_the_reproduction_doc_shows():
    """Each docs/figures/reproduction image of docs/reproduction.md is written by figures.sh from a
    figure `geolens figures` makes (else a figure in the doc would be a hand-copied leftover)."""
    import re

    import geolens.outputs.figures

    shown = set(re.findall(r"\(figures/reproduction/([\w-]+)\.png\)", (SCRIPTS.parent.parent / "docs" / "reproduction.md").read_text()))
    pairs = [p.split("=") for line in (SCRIPTS / "figures.sh").read_text().splitlines()
             if line.startswith("figure ") for p in line.split()[3:]]
    made = set(re.findall(r"FigureSpec\(\"(\w+)\"", Path(geolens.outputs.figures.__file__).read_text()))
    assert shown and {target for _, target in pairs} == shown
    assert {name for name, _ in pairs} <= made


def test_run_gpu_sh_runs_every_paper_row_at_its_seeds_and_budget_on_cuda(tmp_path):
    """Each sweep of run_gpu.sh (a grid file with the script's --seeds/--epochs and --set device=cuda)
    expands into members on the GPU; each table it builds reads a folder one of its sweeps writes, with
    members for every row of the paper's table at the sweep's learning rate (Table 1 at 6e-4 runs on the
    CPU), the paper's seed count and a budget that measures what the paper measured: the paper's own
    where peaks or failures are counted over it (Tables 3, 4, Appendix B), else above its largest onset."""
    import re
    import shlex

    from geolens.outputs.paper import mismatches, paper_table
    from geolens.sweeps.grid import expand, make_grid, resolve_layout

    text = (SCRIPTS / "run_gpu.sh").read_text()
    assert re.search(r'--set device=cuda --quiet "\$@"', text)  # gpu() puts every sweep on the GPU
    sweeps = {}
    for line in text.splitlines():
        if line.startswith("gpu "):
            name, out, *options = shlex.split(line, comments=True)[1:]
            flags = dict(zip(options[::2], options[1::2]))
            assert set(flags) <= {"--seeds", "--epochs"} and len(options) == 2 * len(flags), line
            grid = make_grid(SCRIPTS / f"{name}.toml", {"seeds": flags.get("--seeds"), "epochs": flags.get("--epochs")},
                             ["device=cuda"])
            sweeps[out] = expand(grid, tmp_path / name, resolve_layout(grid, tmp_path / name))
            assert {m.cfg.device for m in sweeps[out]} == {"cuda"}, name
    tables = re.findall(r"\[(\w+)\]=([^\s)]+)", text)
    assert [t for t, _ in tables] == ["table1", "table2", "table3", "table4", "appendixB"]
    for name, out in tables:
        table, members = paper_table(name), sweeps[out]
        rows = [row for row in table.rows() if row.requires["lr"] in {m.cfg.lr for m in members}]
        assert rows, name
        for row in rows:
            matching = [m for m in members if not mismatches(m.cfg, row.requires)]
            assert len({m.cfg.seed for m in matching}) == row.seeds, (name, row.config)
            budgets = {m.cfg.epochs for m in matching}
            if table.kind == "peak" or name == "table4":  # peaks and failures are counted over the whole budget
                assert budgets == {table.epochs}, (name, row.config)
            else:  # an onset row's members stop early: a budget above the paper's largest onset will do
                assert min(budgets) > row.values.get("max", 0), (name, row.config)
    assert "runs/gpu/table2_lr1e-4" in sweeps


@pytest.mark.skipif(shutil.which("git") is None or not (SCRIPTS.parents[1] / ".git").exists(),
                    reason="needs a git checkout")
def test_same_arithmetic_finds_this_commit_identical_and_a_changed_tensor_different(tmp_path):
    same = script("same_arithmetic")
    assert same.compare(["HEAD"], presets=("fb",)) == {"fb": {"HEAD": "="}}  # HEAD trains as this checkout does
    assert same.train(SCRIPTS.parents[1], "ln", tmp_path / "a") is None
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert same.same_checkpoints(tmp_path / "a", tmp_path / "b")
    last = sorted((tmp_path / "b").rglob("step_*.safetensors"))[-1]
    tensors = load_tensors(last)
    name = next(k for k in tensors if k.endswith("W_E"))
    tensors[name] = tensors[name] + torch.finfo(torch.float32).eps * tensors[name].abs().max()  # one ulp-scale change
    save_tensors(last, tensors)
    assert not same.same_checkpoints(tmp_path / "a", tmp_path / "b")
    assert {"e5361e0", "300be03", "3401403"} <= set(same.doc_commits())  # the commits docs/reproduction.md names
