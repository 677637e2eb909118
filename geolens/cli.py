"""The `geolens` command line: train, fork, sweep, info, repair, convert, export, analyze, explore, probe, table, figures,
precursors, noise-floor."""

from __future__ import annotations

import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from geolens.errors import GeoError, GeoWarning
from geolens.model.config import make_config, parse_override

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help="Grokking geometry toolkit.")
# markup off: paths, presets and messages are printed as they are, never parsed as rich markup
console = Console(markup=False)
err = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)

# training options shared by `train` and `sweep`
Preset = Annotated[Optional[str], typer.Option(help="ln, rms, none, sphere, fb, sphere_raw; modifiers +uniform, +fourier, "
                                                  "+notebook (default fb).")]
# help text is rich markup: a literal [ is written \[
Task = Annotated[Optional[str], typer.Option(help="add, sub, mul (Z_p), perm (S_n) or add3 (Z_p sums of 3 operands, "
                                                "\\[a, b, c, =]) (default add).")]
_DEFAULTS = make_config("fb")  # every preset has the same p, lr, epochs and training fraction
Modulus = Annotated[Optional[int], typer.Option("--p", help=f"Modulus (prime) for Z_p tasks (default {_DEFAULTS.p}).")]
Lr = Annotated[Optional[float], typer.Option(help=f"Learning rate (default {_DEFAULTS.lr:g}).")]
Wd = Annotated[Optional[float], typer.Option(help="Weight decay (on all parameters; default: the preset's, 0 for fb, "
                                                  "1 for the others).")]
Epochs = Annotated[Optional[int], typer.Option(help=f"Number of full-batch epochs (default {_DEFAULTS.epochs}).")]
Frac = Annotated[Optional[float], typer.Option(help=f"Training fraction of all pairs (default {_DEFAULTS.frac_train:g}).")]
EvalEvery = Annotated[Optional[int], typer.Option(help="Evaluate every N epochs.")]
Checkpoints = Annotated[Optional[str], typer.Option(help="every:N | log:K | adaptive[:MAXGAP] | ends.")]
Sets = Annotated[list[str], typer.Option("--set", help="Override any config field: --set d_mlp=256 (repeatable).")]
Schedules = Annotated[list[str], typer.Option("--schedule", help="lr, weight_decay or tau for a window of epochs: "
                                              "weight_decay=3.0@2000:2200 (epochs [2000, 2200)); lr=warmup:500 "
                                              "(repeatable; docs/cli.md).")]
Quiet = Annotated[bool, typer.Option(help="No progress bar.")]
Exact = Annotated[bool, typer.Option("--exact", help="At an epoch without a checkpoint, the model at exactly that epoch, "
                                     "replayed from the nearest earlier full state (bit for bit as trained, or refused).")]
# a sweep's list options: each may be repeated, and its repeats combine as one comma list (--lr 1e-3 --lr 6e-4
# is --lr 1e-3,6e-4); any other option given twice is refused (_repeated_option)
Multi = Optional[list[str]]


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        console.print(f"geolens {version('geolens')}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                          help="Print the version and exit.")) -> None:
    """Grokking geometry toolkit."""


def _overrides(sets: list[str], schedules: list[str] = (), **named) -> dict:
    """Config overrides from the named options that were given, then the --set ones (a field set twice
    is refused), then the --schedule entries (added to any `--set schedule=...`)."""
    out = {k: v for k, v in named.items() if v is not None}
    seen: set[str] = set()
    for key, value in (parse_override(text) for text in sets):
        if key in seen:
            raise GeoError(f"--set {key} is given twice; give each field once")
        seen.add(key)
        out[key] = value
    if schedules:
        out["schedule"] = [*out.get("schedule", []), *schedules]
    return out


def _config_fields_epilog() -> str:
    """`geolens train --help`'s list of the config fields `--set` takes, from their declarations."""
    from rich.markup import escape

    from geolens.model.config import GeoConfig
    from geolens.model.roles import fields_help

    return escape("Config fields (--set field=value; their roles: docs/cli.md):\n\n" + fields_help(GeoConfig))


@app.command(epilog=_config_fields_epilog())
def train(
    out: Path = typer.Option(..., help="Run directory to create (refused if it exists, unless --resume/--force)."),
    preset: Preset = None,
    task: Task = None,
    p: Modulus = None,
    seed: Optional[int] = typer.Option(None, help="Initialisation seed (default 0)."),
    data_seed: Optional[int] = typer.Option(None, help="Seed of the train/test split (default: --seed, as a sweep member's)."),
    lr: Lr = None,
    wd: Wd = None,
    epochs: Epochs = None,
    frac: Frac = None,
    eval_every: EvalEvery = None,
    checkpoints: Checkpoints = None,
    early_stop: Optional[int] = typer.Option(None, help="Stop N epochs after test accuracy stays >= 0.99."),
    set_: Sets = [],
    schedule: Schedules = [],
    resume: bool = typer.Option(False, help="Continue the run in --out from its last checkpoint."),
    force: bool = typer.Option(False, help="Replace an existing run in --out."),
    forecast: Optional[Path] = typer.Option(None, help="Forecast file (`geolens precursors --online --save`): once its rule "
                                            "for this configuration fires, the progress line shows the expected onset."),
    quiet: Quiet = False,
) -> None:
    """Train one run and write its run directory."""
    overrides = _overrides(set_, schedule, task=task, p=p, seed=seed, data_seed=data_seed, lr=lr, weight_decay=wd, epochs=epochs,
                           frac_train=frac, eval_every=eval_every, checkpoints=checkpoints, early_stop_after=early_stop)
    if resume and force:
        raise GeoError("--resume and --force contradict each other; choose one")
    if resume and preset is not None:
        raise GeoError("--resume continues the run with its own preset; drop --preset (start a new run to change it)")
    if not resume and "seed" in overrides and "data_seed" not in overrides:
        overrides["data_seed"] = overrides["seed"]  # the paper shuffles the split with the run's seed; so does sweep
    cfg = None if resume else make_config(preset or "fb", **overrides)  # validate before the heavy imports
    rule = None if forecast is None else _forecast_rule(forecast, cfg or _run_config(out, overrides))
    from geolens.training import train as training

    if resume:
        result = training.resume(out, progress=not quiet, forecast=rule, **overrides)
    else:
        result = training.train(cfg, out, force=force, progress=not quiet, forecast=rule)
    _print_summary(result.path)


def _run_config(out: Path, changes: dict):
    """The config a resumed run continues with: its run.json's, with the resumable changes."""
    from geolens.model.config import GeoConfig
    from geolens.runs.storage import RunDir

    return GeoConfig.from_dict({**RunDir(out).read_header()["config"], **changes})


def _forecast_rule(path: Path, cfg):
    """The rule of the forecast file fitted on cfg's configuration (refused in one line when none is)."""
    from geolens.runs.forecast import forecast_for
    from geolens.runs.runset import group_key

    return forecast_for(path, group_key(cfg)).rule


@app.command()
def sweep(
    out: Path = typer.Option(..., help="Sweep folder: members go to OUT/seed_<seed> (one configuration) or, for a "
                             "grid, to folders by preset, lr and seed, e.g. OUT/fb/lr6e-4/seed_1 (with task, p and wd "
                             "levels where those vary; docs/cli.md)."),
    grid: Optional[Path] = typer.Option(None, help="TOML grid file (same keys as these flags; flags given here win)."),
    seeds: Multi = typer.Option(None, help="Initialisation seeds: a range '1-10', a list '1,4,7', or both '1-3,8'."),
    preset: Multi = typer.Option(None, help="Presets, comma-separated: fb,sphere,ln (default fb)."),
    task: Multi = typer.Option(None, help="Tasks, comma-separated (adds a <task> folder level)."),
    p: Multi = typer.Option(None, "--p", help="Moduli, comma-separated (adds a p<p> folder level)."),
    lr: Multi = typer.Option(None, help="Learning rates, comma-separated: 6e-4,1e-3."),
    wd: Multi = typer.Option(None, help="Weight decays, comma-separated (adds a wd<wd> folder level)."),
    epochs: Multi = typer.Option(None, help="Epochs: 5000, or per preset with a default: ln=15000,rms=15000,5000."),
    data_seed: Optional[int] = typer.Option(None, help="One split seed for every member (default: each member's seed)."),
    frac: Frac = None,
    eval_every: EvalEvery = None,
    checkpoints: Optional[str] = typer.Option(None, help="every:N | log:K | adaptive[:MAXGAP] | ends."),
    early_stop: Optional[int] = typer.Option(None, help="Stop a member N epochs after its test accuracy stays >= 0.99."),
    set_: Sets = [],
    schedule: Schedules = [],
    fork_from: Optional[Path] = typer.Option(None, help="Fork sweep: the parent run, or a sweep folder (each run in it "
                                             "a parent); arms in OUT/[<parent>/]step<K>/<change> (docs/cli.md)."),
    steps: Multi = typer.Option(None, help="Fork sweep: the parents' epochs to fork at (any of their trajectories), comma-separated."),
    layout: Optional[str] = typer.Option(None, help="auto (default): flat for one configuration, else nested; or nested, flat."),
    backend: str = typer.Option("local", help="local (worker processes) or ray."),
    workers: Optional[int] = typer.Option(None, help="Jobs at once (local default 1; ray default: the cluster's CPUs / --threads)."),
    threads: Optional[int] = typer.Option(None, help="Torch threads per job (local default: the worker's share of the cores; ray: 1)."),
    address: Optional[str] = typer.Option(None, help="Ray cluster to join: auto or HOST:PORT (default: start a local instance)."),
    force: bool = typer.Option(False, help="Retrain every member from scratch, replacing existing member runs."),
    quiet: bool = typer.Option(False, help="No progress display; only the final table."),
) -> None:
    """Train a grid (presets x seeds x lrs x wds x tasks x p); members of one shape are stacked in one
    process, each written as an ordinary run directory. Rerunning skips finished members and resumes killed ones."""
    from geolens.sweeps.grid import make_grid
    from geolens.sweeps.sweep import member_summary, run_sweep

    preset, seeds, lr, wd, task, p, epochs = (_joined(v) for v in (preset, seeds, lr, wd, task, p, epochs))
    flags = dict(presets=preset, seeds=seeds, lr=lr, wd=wd, task=task, p=p, epochs=epochs, data_seed=data_seed,
                 frac=frac, eval_every=eval_every, checkpoints=checkpoints, early_stop=early_stop, layout=layout)
    spec = make_grid(grid, flags, set_, fork_from, _joined(steps), schedule)
    result = run_sweep(spec, out, backend=backend, workers=workers, threads=threads, address=address, force=force,
                       progress=not quiet, command=["geolens", *sys.argv[1:]])
    table = Table(title=f"{out}: {len(result.members)} members")
    columns = {"name": "member", "seed": "seed", "final_epoch": "final epoch", "test_acc": "test acc",
               "onset_095": "onset_095", "sustained_099": "sustained_099", "stop_reason": "stop", "status": "status"}
    for key, title in columns.items():
        table.add_column(title, no_wrap=key == "name")
    for m in result.members:
        row = member_summary(m, result.status[m.name])
        table.add_row(*(f"{row[c]:.4f}" if c == "test_acc" and row.get(c) is not None else str(row.get(c, "-"))
                        for c in columns))
    (console if console.is_terminal else Console(width=200, markup=False)).print(table)  # in a log or a pipe: never truncated
    if result.failed:
        for name in result.failed:
            err.print(f"{name}: {result.errors.get(name, '')}", highlight=False, soft_wrap=True)
        err.print(Text.assemble(("error:", "red"), f" {len(result.failed)} of {len(result.members)} members failed "
                                f"(errors above and in {out / 'sweep.json'}); rerun the same command to retry them"))
        raise typer.Exit(1)


@app.command()
def fork(
    run: Path = typer.Option(..., help="Parent run directory (only read)."),
    step: int = typer.Option(..., help="Epoch to fork at: any epoch of the parent's trajectory (its stored state, "
                             "or replayed from the nearest earlier full state: docs/run-format.md)."),
    out: Path = typer.Option(..., help="New run directory for the fork (refused if it exists, unless --force)."),
    epochs: Epochs = None,
    set_: Sets = [],
    schedule: Schedules = [],
    force: bool = typer.Option(False, help="Replace an existing run in --out."),
    quiet: Quiet = False,
) -> None:
    """Fork a run at any epoch into a new run with changed settings (optimizer, readout, attention, norm,
    schedules, norm clamp) and train it on; with no change it is a replay: it reproduces the parent's later
    checkpoints bit for bit (a determinism check)."""
    changes = _overrides(set_, epochs=epochs)
    from geolens.training.fork import fork as fork_run

    result = fork_run(run, step, out, changes, force=force, progress=not quiet, schedule=schedule)
    _print_summary(result.path)


#: the demo's run; a checkpoint every 100 epochs (at most 31, 23 when it stops at 2,190) keeps its run directory,
#: analysis and explorer included, under 50 MB (docs/run-format.md, "The demo's run directory")
DEMO = dict(preset="fb", task="add", p=113, lr=6e-4, seed=1, data_seed=1, epochs=3000, early_stop_after=300,
            checkpoints="every:100")


@app.command()
def demo(
    out: Path = typer.Option(Path("runs/demo"), help="Run directory (reused if it already holds the demo run)."),
    quiet: bool = typer.Option(False, help="No progress bars."),
) -> None:
    """The main job: train the default run (fully bounded sphere, Z_113 addition, lr 6e-4, seed 1, a checkpoint
    every 100 epochs, early stop 300 epochs after test accuracy holds >= 0.99), analyse its trajectory, write the
    report and the explorer."""
    from geolens.analysis.trajectory import analyze_run
    from geolens.outputs.report import write_report
    from geolens.runs.run import load_run
    from geolens.runs.storage import RunDir
    from geolens.training import train as training

    cfg = make_config(**DEMO)
    run_dir = RunDir(out)
    if not run_dir.exists():
        training.train(cfg, out, progress=not quiet)
    else:
        header = run_dir.read_header()
        # neither the storage policy nor the checkpoint schedule (an earlier demo's was adaptive) is the run's identity
        if {**header["config"], "keep": cfg.keep, "checkpoints": cfg.checkpoints} != cfg.to_dict():
            raise GeoError(f"{out} holds a different run; choose another --out for the demo")
        if header.get("status") != "finished":
            training.resume(out, progress=not quiet)
            console.print(f"continued the unfinished demo run in {out} to its end")
        else:
            console.print(f"reusing the finished demo run in {out}")
    traj = analyze_run(load_run(out), progress=not quiet)
    report = write_report(traj)
    explorer = _explorer_beside(traj, report)
    _print_summary(out)
    console.print(f"report: {report}")
    console.print(f"explorer: {explorer}")


@app.command()
def info(
    run: Path = typer.Option(..., help="Run directory."),
    forecast: Optional[Path] = typer.Option(None, help="Forecast file: replay its rule for this run's configuration on "
                                            "the record (default: the rule the run was trained with, if any)."),
    checkpoints: bool = typer.Option(False, "--checkpoints", help="List every checkpoint: epoch, train and test "
                                     "accuracy, and where a fork there starts from (its stored state or a replay)."),
) -> None:
    """Summarise a run: config, progress, onset events and forecast, checkpoints, and any damage (exit 1 if damaged)."""
    from geolens.runs.integrity import problems
    from geolens.runs.storage import RunDir

    damage = problems(RunDir(run))
    rule = None if forecast is None else _forecast_rule(forecast, _run_config(run, {}))
    _print_summary(run, damage, rule)
    if checkpoints:
        _print_checkpoints(run)
    if damage:
        sys.exit(1)


def _print_checkpoints(path: Path) -> None:
    """The checkpoint table of `geolens info --checkpoints`."""
    from geolens.runs.run import load_run
    from geolens.training.replay import full_states, owner

    r = load_run(path)
    table = Table(title=f"checkpoints of {path}")
    for column in ("epoch", "train acc", "test acc", "optimizer state"):
        table.add_column(column, justify="right" if column != "optimizer state" else "left")
    full: dict[Path, list[int]] = {}
    for entry in r.manifest:
        home = owner(r, entry["step"])
        states = full.setdefault(home.path, full_states(home))
        before = [s for s in states if s <= entry["step"]]
        where = "" if home.path == r.path else f" (in {home.path})"
        state = ("stored" if before and before[-1] == entry["step"] else
                 f"replayed from epoch {before[-1]}" if before else "none (weights only)") + where
        table.add_row(str(entry["step"]), f"{entry['train_acc']:.4f}", f"{entry['test_acc']:.4f}", state)
    console.print(table)


@app.command()
def repair(run: Path = typer.Option(..., help="Run directory.")) -> None:
    """Make a damaged run directory consistent where that is exact: rebuild the manifest from the
    checkpoint files, move damaged checkpoints to checkpoints/damaged/, recompute events.json."""
    from geolens.runs.integrity import repair as repair_run
    from geolens.runs.runlock import RunLock
    from geolens.runs.storage import RunDir

    with RunLock(run, "repair"):
        done = repair_run(RunDir(run))
    for line in done or [f"{run} is consistent; nothing to repair"]:
        console.print(line)


@app.command()
def convert(
    run: Path = typer.Option(..., help="Run directory to convert in place."),
    keep: str = typer.Option(..., help="Storage policy: all (the optimizer state at every checkpoint) or sparse:N "
                             "(at the first checkpoint of every N epochs; the default for new runs: sparse:5000)."),
    quiet: Quiet = False,
) -> None:
    """Store a run under another storage policy without losing exactness: a replay checks every optimizer state it
    drops (and every checkpoint's weights) bit for bit, and computes those it adds; run.json records the policy."""
    from geolens.model.schedule import parse_keep
    from geolens.training.replay import convert_storage

    parse_keep(keep)
    for line in convert_storage(run, keep, progress=not quiet):
        console.print(line)


@app.command()
def export(
    run: Path = typer.Option(..., help="Finished run directory to copy from."),
    out: Path = typer.Option(..., help="New folder for the trimmed copy (refused if it exists)."),
    steps: str = typer.Option(..., help="Comma-separated epochs to keep, each as its nearest checkpoint (epoch 0 "
                              "and the last checkpoint are always kept)."),
) -> None:
    """Write a trimmed copy of a run for shipping: run.json, metrics.csv, events.json and the chosen
    checkpoints; no resume state (analysis only)."""
    from geolens.runs.export import export_run
    from geolens.runs.run import load_run

    src = load_run(run)
    done = load_run(export_run(run, out, [_checkpoint(src, s) for s in _ints(steps, "--steps") or []]))
    size = sum(f.stat().st_size for f in done.path.rglob("*") if f.is_file())
    console.print(f"exported {len(done.steps)} checkpoints (epochs {', '.join(map(str, done.steps))}) to {out}, "
                  f"{size / 1e6:.1f} MB; analyse it with `geolens analyze --run {out}`")


@app.command()
def analyze(
    run: Path = typer.Option(..., help="Run directory."),
    metrics: Optional[str] = typer.Option(None, help="Comma-separated metric names (default: all)."),
    steps: Optional[str] = typer.Option(None, help="Comma-separated epochs, each as its nearest checkpoint (a line "
                                        "says which; default: every checkpoint)."),
    at: Optional[str] = typer.Option(None, help="Epochs for the per-step figures (default: onset and final)."),
    static: str = typer.Option("png,svg", help="Static figure formats: png, pdf, svg, comma-separated ('' for none)."),
    keys: str = typer.Option("final", help="Key frequencies of fve_paper, restricted/excluded loss, embed_circles: "
                             "'final' (the last checkpoint's, for the whole run, as Nanda et al.), 'each' (each "
                             "checkpoint's own) or e.g. 4,32."),
    workers: Optional[int] = typer.Option(None, help="Processes computing checkpoints, one thread each, this one "
                                          "included (default: one per CPU core when at least 16 checkpoints need "
                                          "computing, else 1: only this process)."),
    out: Optional[Path] = typer.Option(None, help="Folder for the analysis (cache, metrics.csv, report, figures); "
                                       "default RUN/analysis. Use it for a read-only run."),
    llc: str = typer.Option("", help="SGLD settings of the llc metric, e.g. lr=1e-7,n_beta=1000,draws=20000 (fields of "
                            "LLCSettings; the rest DEFAULT_LLC's, calibrated on fb: docs/landscape.md)."),
    explorer: bool = typer.Option(True, help="Also write the trajectory explorer (analysis/explorer/index.html, "
                                  "sharing the report's plotly.min.js; `geolens explore` for several runs or a folder "
                                  "that stands alone)."),
    quiet: bool = typer.Option(False, help="No progress bar."),
) -> None:
    """Evaluate metrics at every checkpoint (cached), write analysis/metrics.csv, analysis/report.html and the
    trajectory explorer analysis/explorer/index.html."""
    from geolens.analysis.llc import LLCSettings
    from geolens.analysis.trajectory import analyze_run
    from geolens.outputs.plots import check_formats
    from geolens.outputs.report import write_report
    from geolens.runs.run import load_run

    formats = tuple(f for f in static.split(",") if f)
    check_formats(formats)
    r = load_run(run)
    try:
        key_choice = keys if keys in ("final", "each") else [int(k) for k in keys.split(",")]
    except ValueError:
        raise GeoError(f"--keys '{keys}' must be final, each or comma-separated frequencies, e.g. --keys 4,32") from None
    settings = LLCSettings.parse(llc)
    wanted = _ints(steps, "--steps")
    wanted = None if wanted is None else [_checkpoint(r, s) for s in wanted]
    traj = analyze_run(r, _names(metrics), wanted, progress=not quiet, keys=key_choice,
                       workers=workers, out=out, llc=settings)
    report = write_report(traj, _ints(at, "--at"), formats)
    console.print(f"{len(traj.steps)} checkpoints, {traj.computed} metric evaluations computed "
                  f"(the rest from cache); table {traj.out / 'metrics.csv'}; report {report}")
    if explorer:
        console.print(f"explorer: {_explorer_beside(traj, report)}")
    by_reason: dict[str, list[str]] = {}
    for name, reason in traj.skipped.items():  # one line per reason: a pre-norm run skips most metrics alike
        by_reason.setdefault(reason, []).append(name)
    for reason, names in by_reason.items():
        console.print(f"skipped {', '.join(names)}: {reason}")


def _explorer_beside(traj, report: Path) -> Path:
    """The explorer of `analyze` and `demo`, TRAJ.out/explorer/index.html: it loads the report's plotly.min.js
    (../plotly.min.js), so that an analysis folder holds plotly.js once (docs/run-format.md)."""
    from geolens.outputs.explorer import write_explorer
    from geolens.outputs.plots import PLOTLY_JS

    return write_explorer([traj], traj.out / "explorer", plotly=report.parent / PLOTLY_JS)


@app.command()
def explore(
    run: Annotated[list[Path], typer.Option(help="Run directory (repeat --run for several runs side by side).")],
    out: Path = typer.Option(..., help="Folder for the explorer (index.html, its script, plotly.js, the data); "
                             "new, empty or an earlier explorer."),
    quiet: bool = typer.Option(False, help="No progress bar."),
) -> None:
    """Write the trajectory explorer: a static page (open OUT/index.html from disk, no server, no network) where one
    step slider drives every view of the runs; each run's analysis cache is read (what it lacks is computed)."""
    from geolens.analysis.trajectory import analyze_run
    from geolens.outputs.explorer import check_out, write_explorer
    from geolens.runs.run import load_run

    check_out(out)
    trajs = [analyze_run(load_run(path), progress=not quiet) for path in run]
    console.print(f"explorer: {write_explorer(trajs, out)} (open it in a browser)")


@app.command()
def probe(
    run: Path = typer.Option(..., help="Run directory."),
    step: int = typer.Option(..., help="Any epoch of the trajectory: its nearest checkpoint (a line says which), or "
                             "with --exact the model at that epoch."),
    exact: Exact = False,
) -> None:
    """Print the circuit at one step: key frequencies, FVE, Clock/Pizza verdict, top heads and neurons."""
    from geolens.analysis.probe import describe, probe_run
    from geolens.runs.run import load_run

    r = load_run(run)
    used = step if exact else _checkpoint(r, step)
    table = Table(show_header=False, title=f"{run} @ {used}")
    model = _model_at(r, step) if exact else None
    for label, text in describe(probe_run(r, used, model)):
        table.add_row(label, text)
    console.print(table)


@app.command()
def barrier(
    run: list[Path] = typer.Option(..., help="Run directory, twice: --run A --step K --run B --step L (B may be A)."),
    step: list[int] = typer.Option(..., help="Epoch of each --run, in the same order: any epoch of its trajectory, "
                                   "as its nearest checkpoint (a line says which), or exactly with --exact."),
    points: int = typer.Option(21, help="Points on the line, alpha = 0 .. 1."),
    out: Optional[Path] = typer.Option(None, help="Folder for barrier.json, .csv, .png, .svg (default: A/analysis/barriers)."),
    exact: Exact = False,
) -> None:
    """Train and test loss along the straight line between two checkpoints, and the barrier height over the chord."""
    from geolens.analysis.barrier import loss_barrier
    from geolens.outputs.barrier_report import write_barrier
    from geolens.runs.run import load_run

    if len(run) != 2 or len(step) != 2:
        raise GeoError(f"barrier takes two checkpoints, --run A --step K --run B --step L (got {len(run)} --run and "
                       f"{len(step)} --step)")
    if points < 2:
        raise GeoError(f"--points {points}: the line needs at least its two end points")
    runs = [load_run(r) for r in run]
    step = step if exact else [_checkpoint(r, s) for r, s in zip(runs, step)]
    labels = tuple(f"{r.path.name}@{s}" for r, s in zip(runs, step))
    b = loss_barrier(*(_model_at(r, s) for r, s in zip(runs, step)), points, labels)
    folder = out or runs[0].path / "analysis" / "barriers"
    stem = f"barrier_{step[0]}_{runs[1].path.name}_{step[1]}"
    paths = write_barrier(b, folder, stem)
    console.print(f"barrier {labels[0]} -> {labels[1]}: train {b.barrier_train:.4g} (at alpha {b.argmax_train:.2f}), "
                  f"test {b.barrier_test:.4g} (at alpha {b.argmax_test:.2f}); wrote {', '.join(str(p) for p in paths)}",
                  markup=False, highlight=False, soft_wrap=True)


@app.command("llc-calibrate")
def llc_calibrate(
    run: Path = typer.Option(..., help="Run directory."),
    step: int = typer.Option(..., help="Epoch to sample around: any epoch of the trajectory, as its nearest "
                             "checkpoint (a line says which), or exactly with --exact."),
    lrs: str = typer.Option("5e-6,1e-5", "--lr", help="Comma-separated SGLD step sizes (default: DEFAULT_LLC's and "
                            "twice it)."),
    n_betas: str = typer.Option("100,464", "--n-beta", help="Comma-separated inverse temperatures n * beta (default: "
                                "DEFAULT_LLC's, n / ln n at the paper's n, and 100)."),
    localization: Optional[float] = typer.Option(None, help="Localisation strength (default: DEFAULT_LLC's)."),
    draws: Optional[int] = typer.Option(None, help="Draws per chain (default: DEFAULT_LLC's)."),
    burnin: Optional[int] = typer.Option(None, help="SGLD steps per chain before the draws, left out of the estimate "
                                         "and traces (default: DEFAULT_LLC's)."),
    sampler: str = typer.Option("sgld", help="'sgld' (devinterp's plain SGLD) or 'rmsprop_sgld' (its RMSprop-"
                                "preconditioned SGLD; the drift column assumes plain SGLD)."),
    out: Optional[Path] = typer.Option(None, help="Folder for llc_calibration.md, .csv, .png, .svg "
                                       "(default: RUN/analysis/llc_calibration_STEP)."),
    exact: Exact = False,
) -> None:
    """Sweep the LLC sampler's step size x n_beta at one checkpoint: estimates, loss traces, which are stable, and the
    one setting to use (llc.recommend's rule)."""
    from dataclasses import replace

    from geolens.analysis.llc import DEFAULT_LLC, calibrate, recommend
    from geolens.outputs.llc_report import calibration_table, write_calibration
    from geolens.runs.run import load_run

    grid = [[_positive(v, flag) for v in text.split(",") if v.strip()] for text, flag in ((lrs, "--lr"), (n_betas, "--n-beta"))]
    r = load_run(run)
    step = step if exact else _checkpoint(r, step)
    base = DEFAULT_LLC
    if localization is not None:
        base = replace(base, localization=_positive(str(localization), "--localization"))
    if draws is not None:
        base = replace(base, draws=int(_positive(str(draws), "--draws")))
    if burnin is not None and burnin < 0:
        raise GeoError(f"--burnin {burnin} must be >= 0 (SGLD steps per chain before the draws)")
    base = replace(base, sampler=sampler, burnin=base.burnin if burnin is None else burnin)
    x, y = r.dataset.train
    rows, curvature = calibrate(_model_at(r, step), x, y, grid[0], grid[1], base)
    picked = recommend(rows, len(x))
    label = f"{r.path} at epoch {step}"
    paths = write_calibration(rows, base, label, curvature, picked, out or r.path / "analysis" / f"llc_calibration_{step}")
    console.print(calibration_table(rows, base, label, curvature, picked), markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {', '.join(str(p) for p in paths)}", markup=False, highlight=False, soft_wrap=True)


def _checkpoint(r, step: int) -> int:
    """The checkpoint a command uses for epoch `step` of run r: that epoch's, else the nearest, said in one line
    (an epoch outside the trajectory is refused)."""
    nearest = r.nearest_step(step)
    if nearest != step:
        err.print(f"note: {r.path} has no checkpoint at epoch {step}; using the nearest, epoch {nearest} "
                  "(`geolens info --checkpoints` lists them; --exact replays to the epoch where a command has it)")
    return nearest


def _model_at(r, step: int):
    """The model of run r at any epoch of its trajectory: its checkpoint, or replayed there (training.replay)."""
    from geolens.training.replay import model_at_epoch

    return model_at_epoch(r, step, progress=True)


def _positive(text: str, flag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise GeoError(f"{flag} {text!r} is not a number; give comma-separated positive numbers (e.g. {flag} 1e-6,1e-5)") from None
    if not value > 0:
        raise GeoError(f"{flag} {value:g} must be > 0")
    return value


@app.command()
def table(
    runs: Path = typer.Option(..., help="Folder searched recursively for run directories (any folder with run.json)."),
    paper: Optional[str] = typer.Option(None, help="table1, table2, table3, table4 or appendixB (default: every "
                                        "table some configuration belongs to, by task and attention)."),
    out: Optional[Path] = typer.Option(None, help="Folder for <table>.md, <table>.csv, <table>_runs.csv "
                                       "(default: RUNS/tables)."),
) -> None:
    """Rebuild the paper's tables from runs: onsets (or peak accuracy) per configuration, the 95% t-interval of the mean, the paper's row, a verdict."""
    from geolens.outputs.tables import build_tables, rich_table, write_table

    built, notes = build_tables(runs, paper)
    folder = out or runs / "tables"
    for t in built:
        console.print(rich_table(t))
        for note in t.notes + notes:
            console.print(f"  - {note}", markup=False, highlight=False, soft_wrap=True)
        paths = write_table(t, notes, folder)
        console.print(f"wrote {', '.join(map(str, paths))}\n", markup=False, highlight=False, soft_wrap=True)


@app.command()
def figures(
    runs: Path = typer.Option(..., help="Folder searched recursively for run directories (any folder with run.json)."),
    out: Optional[Path] = typer.Option(None, help="Output folder (default: RUNS/figures)."),
    paper: Optional[str] = typer.Option(None, help="Restrict the onsets figure to one paper table (as `geolens table --paper`)."),
    at: str = typer.Option("first099", help="Checkpoint of the spectrum and FVE figures: 'first099' (the first with test "
                           "acc >= 0.99, as the paper's section 4.3; else the last) or 'final'."),
    all_seeds: bool = typer.Option(False, help="A Clock-vs-Pizza path for every run, not only the lowest seed of each configuration."),
    formats: str = typer.Option("png,pdf", help="Static formats, comma-separated ('' for none); figures.html is always written."),
) -> None:
    """Regenerate the paper's figures (and geolens's own) from runs: PNG + PDF each, one interactive HTML page."""
    from geolens.outputs.figures import build_figures, write_figures
    from geolens.outputs.plots import check_formats

    static = tuple(f for f in formats.split(",") if f)
    check_formats(static)
    specs, notes = build_figures(runs, paper, at, all_seeds,
                                 log=lambda msg: console.print(msg, markup=False, highlight=False, soft_wrap=True))
    paths = write_figures(specs, out or runs / "figures", static, notes, str(runs))
    for note in notes:
        console.print(f"  - {note}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"{len(specs)} figures: {', '.join(s.name for s in specs)}; wrote {len(paths)} files, "
                  f"page {paths[-1]}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def precursors(
    runs: Path = typer.Option(..., help="Folder searched recursively for run directories (any folder with run.json)."),
    out: Optional[Path] = typer.Option(None, help="Folder for precursors.md and precursors.csv (default: RUNS/precursors)."),
    online: bool = typer.Option(False, help="Also test online threshold rules on every recorded column, fitted "
                                "leave-one-seed-out (precursors_online.md/.csv)."),
    min_warning: int = typer.Option(100, help="Online rules: the least warning (epochs before the onset) a rule must give "
                                    "on the runs it is fitted on; a rule that fires at the onset is no forecast."),
    columns: Optional[str] = typer.Option(None, help="Online rules: only these columns, comma-separated (a smaller "
                                          "family of tests for the Holm correction; default: every recorded column)."),
    save: Optional[Path] = typer.Option(None, help="Online rules: write each configuration's best rule (fitted on all "
                                        "its runs) to this forecast file, for `geolens train --forecast FILE`."),
    check: Optional[Path] = typer.Option(None, help="Score a forecast file on the runs (new seeds): each run's forecast "
                                         "and onset, against the fitting runs' mean onset (forecast_check.md)."),
    nongrokking: Optional[Path] = typer.Option(None, help="Online rules: a folder of runs that did not grok within their "
                                               "budget, scored for false alarms against the configuration equal to "
                                               "theirs but for weight decay and norm placement (runs of --runs without an "
                                               "onset count too)."),
    horizon: int = typer.Option(2000, help="Online rules: an alarm more than this many epochs before the onset is "
                                "early, a false alarm (precursors_alarms.md)."),
) -> None:
    """Which recorded quantity announces the onset: per configuration and precursor, how often its event
    precedes the onset, the lead with its order-statistic interval, its Spearman correlation with the onset
    with a permutation p-value (Holm-corrected over the table) and a leave-one-out prediction; and the
    figure of every precursor against epochs relative to the onset. --online: threshold rules on every
    recorded column tested held-out with their misses and false alarms, the error of choosing the column
    (nested), lead time against false-alarm rate, and --save the forecast file."""
    from geolens.outputs.plots import save_static
    from geolens.outputs.precursor_table import (ALARM_COLUMNS, CHECK_COLUMNS, COLUMNS, ONLINE_COLUMNS, SELECTION_COLUMNS,
                                                 alarm_rows, check_columns, check_rows, fig_precursors, load_groups,
                                                 nongrokking_runs, online_rows, precursor_rows, selection_rows,
                                                 write_precursor_table)
    from geolens.runs.forecast import write_forecasts

    if not online and (save is not None or columns is not None or nongrokking is not None):
        raise GeoError("--save, --columns and --nongrokking apply to the online rules; add --online")
    if online and horizon <= min_warning:
        raise GeoError(f"--horizon {horizon} must exceed --min-warning {min_warning}: an alarm in time comes between them")
    if min_warning < 0:
        raise GeoError(f"--min-warning {min_warning} must be >= 0 epochs")
    names = _column_names(columns)
    groups, found = load_groups(runs)  # read once for every table below
    check_columns(groups, names)
    rows, notes, groups = precursor_rows(groups, found)
    folder = out or runs / "precursors"
    _print_rows(f"{runs}: precursors of the onset (onset_095)", COLUMNS, rows, notes)
    paths = write_precursor_table(rows, notes, folder)
    spec = fig_precursors(groups)
    if spec is not None:
        paths += save_static(spec, folder, ("png",))
    if online:
        more, more_found = load_groups(nongrokking) if nongrokking is not None else ([], [])
        more_found = [f"runs that did not grok ({nongrokking}): {note}" for note in more_found]
        negatives = nongrokking_runs(groups, more)
        rows, notes, forecasts = online_rows(groups, found + more_found, min_warning, names, negatives, horizon)
        _print_rows(f"{runs}: online threshold rules, leave-one-seed-out (min warning {min_warning:,})",
                    ONLINE_COLUMNS, rows, notes)
        paths += write_precursor_table(rows, notes, folder, "precursors_online", ONLINE_COLUMNS)
        rows, notes = selection_rows(groups, forecasts, min_warning, names, horizon)
        _print_rows(f"{runs}: the held-out error of choosing the column (on all seeds, and nested)", SELECTION_COLUMNS,
                    rows, notes)
        paths += write_precursor_table(rows, notes, folder, "precursors_online_selection", SELECTION_COLUMNS)
        rows, notes = alarm_rows(groups, forecasts, negatives, min_warning, horizon)
        _print_rows(f"{runs}: lead time against false alarms (horizon {horizon:,})", ALARM_COLUMNS, rows, notes)
        paths += write_precursor_table(rows, notes, folder, "precursors_alarms", ALARM_COLUMNS)
        if save is not None:
            paths.append(write_forecasts(save, forecasts, min_warning))
            for f in forecasts:
                console.print(f"forecast for {f.configuration}: {f.rule.describe()}, onset at firing + {f.rule.lead:,.0f} "
                              f"(held-out MAE {f.loo_mae:,.0f}, mean onset's {f.baseline_mae:,.0f})", soft_wrap=True)
    if check is not None:
        rows, notes = check_rows(groups, found, check)
        _print_rows(f"{runs}: the forecasts of {check}", CHECK_COLUMNS, rows, notes)
        paths += write_precursor_table(rows, notes, folder, "forecast_check", CHECK_COLUMNS)
    console.print(f"wrote {', '.join(map(str, paths))}", markup=False, highlight=False, soft_wrap=True)


@app.command("noise-floor")
def noise_floor(
    runs: list[Path] = typer.Option(..., help="Folder searched recursively for run directories: the same configuration "
                                    "and seed trained in several float orders (engine, threads, stacked, machine); "
                                    "repeatable (the runs of every folder together)."),
    out: Optional[Path] = typer.Option(None, help="Folder for noise_floor.md, .csv and .json (default: the first "
                                       "RUNS/noise_floor)."),
) -> None:
    """The float-order noise floor of the onset: per configuration, machine and seed, the onset of every float
    order and their range (committed replicates only); per configuration and machine the floor (the largest
    range), against which shifts on that machine are judged."""
    from geolens.outputs.noise_floor_table import floor_tables, write_floor_tables

    floors, notes = floor_tables(runs)
    for f in floors:
        console.print(f"{f.configuration} on {f.machine}: floor {f.floor if f.floor is not None else '-'} epochs",
                      soft_wrap=True)
        for s in f.seeds:
            onsets = ", ".join(f"{o}: {v if v is not None else 'none'}{'*' if o in s.uncommitted else ''}"
                               for o, v in s.onsets.items())
            console.print(f"  seed {s.seed}: range {s.range if s.range is not None else '-'} ({onsets})", soft_wrap=True)
    for note in notes:
        console.print(f"  - {note}", soft_wrap=True)
    paths = write_floor_tables(floors, notes, out or runs[0] / "noise_floor")
    console.print(f"wrote {', '.join(map(str, paths))}", soft_wrap=True)


def _print_rows(title: str, columns: list[str], rows: list[dict[str, str]], notes: list[str]) -> None:
    """A table of text rows and its notes on the console: within the terminal's width (cells wrap), wide
    when not a terminal; no frame when there are no rows (the notes say why: no run has an onset)."""
    if not rows:
        console.print(f"{title}: no onset, nothing to tabulate", soft_wrap=True)
    else:
        table = Table(title=title)
        for column in columns:
            table.add_column(column, no_wrap=column == "configuration" and not console.is_terminal,
                             overflow="fold")
        for row in rows:
            table.add_row(*(row[c] for c in columns))
        (console if console.is_terminal else Console(width=240, markup=False)).print(table)
    for note in notes:
        console.print(f"  - {note}", markup=False, highlight=False, soft_wrap=True)


def _joined(values: list[str] | None) -> str | None:
    """A repeated list option's values as one comma list (None when not given)."""
    return ",".join(values) if values else None


def _repeated_option(argv: list[str]) -> str | None:
    """The one-line complaint about an option of a single value given more than once in `argv`
    (click would keep only the last), or None."""
    command = typer.main.get_command(app)
    sub = getattr(command, "commands", {}).get(argv[0]) if argv else None
    if sub is None:
        return None
    for param in sub.params:
        if getattr(param, "param_type_name", None) != "option" or param.multiple or param.is_flag:  # click's or typer's
            continue
        given = [a for a in argv[1:] if a in param.opts or any(a.startswith(f"{o}=") for o in param.opts)]
        if len(given) > 1:
            return (f"{param.opts[0]} is given {len(given)} times; it takes one value (a repeat would silently replace "
                    "the first): give it once")
    return None


def _names(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def _column_names(text: str | None) -> list[str] | None:
    """--columns' metrics columns under their present names, with a note on stderr for each old one."""
    from geolens.runs.storage import current_column

    names = _names(text)
    for name in names or []:
        if current_column(name) != name:
            err.print(f"note: --columns {name} is the column now called {current_column(name)} (docs/metrics.md, "
                      "\"Precursor columns\"); reading it as that")
    return [current_column(n) for n in names] if names else names


def _ints(text: str | None, flag: str) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise GeoError(f"{flag} '{text}' must be comma-separated integers, e.g. {flag} 0,400,1200") from None


def _print_summary(path: Path, damage: list[str] = (), forecast=None) -> None:
    from geolens.runs.run import load_run

    table = Table(show_header=False, title=str(path))
    for key, value in load_run(path).summary(forecast).items():
        if value is not None:
            table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    for problem in damage:
        table.add_row(Text("damaged", style="red"), problem)
    console.print(table)


EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_TERMINATED = 2, 1, 130, 143
CONTINUE = {  # how an interrupted command continues from what it wrote
    "train": "continue from the last checkpoint with `geolens train --resume --out DIR`",
    "fork": "continue the fork from its last checkpoint with `geolens train --resume --out OUT`",
    "sweep": "rerun the same sweep command: finished members are skipped, the others resume from their last checkpoint",
    "analyze": "rerun analyze: it computes only what is missing",
    "demo": "rerun demo: it continues the run from its last checkpoint",
}
_terminated = False
TRAINING_COMMANDS = ("train", "fork", "sweep", "demo")  # their OpenMP wait policy is chosen from the load at start


def _on_sigterm(signum, frame) -> None:
    """SIGTERM ends a command like Ctrl-C: writes in progress finish, the last checkpoint is kept."""
    global _terminated
    _terminated = True
    raise KeyboardInterrupt


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    if issubclass(category, GeoWarning):
        err.print(Text.assemble(("warning:", "yellow"), f" {message}"))
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


_default_showwarning = warnings.showwarning


def _fail(message: str, code: int = EXIT_USAGE) -> None:
    err.print(Text.assemble(("error:", "red"), f" {message}"))
    sys.exit(code)


def _usage_problem(e: BaseException) -> str | None:
    """The one-line message of a command-line usage error (click's or the click typer vendors)."""
    if not (hasattr(e, "format_message") and getattr(e, "exit_code", None) == 2):
        return None
    ctx = getattr(e, "ctx", None)
    command = ctx.command_path if ctx is not None else "geolens"
    if type(e).__name__ == "NoArgsIsHelpError":
        return (f"{command} needs a command; run `{command} --help` to list them" if command == "geolens"
                else f"{command} needs options; run `{command} --help` to see them")
    return f"{e.format_message().rstrip('.')}; run `{command} --help` for its usage"


def main() -> None:
    """The console script: runs the typer app; every failure is one line on stderr with a non-zero exit
    (2: bad input or usage, 130: Ctrl-C, 143: SIGTERM, 1: an internal error, traceback with GEOLENS_DEBUG=1)."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    warnings.showwarning = _show_warning
    if len(sys.argv) > 1 and sys.argv[1] in TRAINING_COMMANDS and "--help" not in sys.argv:
        from geolens.training.wait_policy import choose_wait_policy

        choose_wait_policy()  # before torch is imported: how its threads wait, from the load now
    try:
        repeated = _repeated_option(sys.argv[1:])
        if repeated:
            raise GeoError(repeated)
        code = app(prog_name="geolens", standalone_mode=False)  # non-standalone typer returns exit codes (130 for Ctrl-C) instead of exiting
    except GeoError as e:
        _fail(str(e))
    except (typer.Exit, SystemExit) as e:
        sys.exit(getattr(e, "exit_code", getattr(e, "code", 0)))
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except Exception as e:
        from geolens.training.resources import is_out_of_memory

        if os.environ.get("GEOLENS_DEBUG"):
            raise
        usage = _usage_problem(e)
        if usage is not None:
            _fail(usage)
        if type(e).__name__ == "Abort":
            sys.exit(EXIT_INTERRUPTED)
        if isinstance(e, OSError):
            where = f" ({e.filename})" if e.filename else ""
            _fail(f"{e.strerror or e}{where}; check that the folder exists, is writable and has free space")
        if is_out_of_memory(e):
            _fail(f"out of memory ({str(e).splitlines()[0][:120]}); use a smaller p or model, or a machine with more "
                  "memory")
        _fail(f"internal error: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}; rerun with "
              "GEOLENS_DEBUG=1 for the traceback and report it", EXIT_INTERNAL)
    if code == EXIT_INTERRUPTED:
        what = "terminated" if _terminated else "interrupted"
        command = sys.argv[1] if len(sys.argv) > 1 else ""
        err.print(f"{what}: what was already written is kept; {CONTINUE.get(command, 'rerun the same command')}")
        sys.exit(EXIT_TERMINATED if _terminated else EXIT_INTERRUPTED)
    if isinstance(code, int) and code:
        sys.exit(code)
