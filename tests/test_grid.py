"""Sweep grids: expansion, folder names, the layout of existing sweeps, per-preset epochs, member
states on disk (done / resume / finish / restart / refused) and the job plan. No worker processes here
(tests/test_sweep_backends.py runs them)."""

import json

import pytest

from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.model.schedule import parse_schedule
from geolens.sweeps.grid import (
    Job,
    Member,
    chunks,
    expand,
    inspect_member,
    make_grid,
    number_label,
    parse_epochs,
    plan_jobs,
    resolve_layout,
)
from geolens.sweeps.sweep import run_sweep
from geolens.training.batched import train_batched

TINY = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.5, eval_every=5)
TINY_SET = ["d_model=32", "d_head=8", "d_mlp=64"]
TABLE1 = ["fb", "sphere", "fb+fourier", "sphere+fourier", "ln", "rms"]


def _names(grid, out, layout=None):
    return [m.name for m in expand(grid, out, layout or resolve_layout(grid, out))]


def test_table1_command_maps_onto_the_reproduction_folders(tmp_path):
    grid = make_grid(flags=dict(presets=",".join(TABLE1), lr="6e-4", seeds="1-10", epochs="ln=15000,rms=15000,5000",
                                early_stop=200, checkpoints="every:1000"))
    members = expand(grid, tmp_path, resolve_layout(grid, tmp_path))
    assert len(members) == 60
    assert [m.name for m in members[:2]] == ["fb/lr6e-4/seed_1", "fb/lr6e-4/seed_2"]
    assert {m.name.rsplit("/", 1)[0] for m in members} == {f"{p}/lr6e-4" for p in TABLE1}
    assert all(m.path == tmp_path / m.name for m in members)
    by_name = {m.name: m.cfg for m in members}
    # each member's config is exactly what the single-configuration command gave its seed
    assert by_name["fb/lr6e-4/seed_3"] == make_config("fb", lr=6e-4, epochs=5000, early_stop_after=200,
                                                      checkpoints="every:1000", seed=3, data_seed=3)
    assert by_name["ln/lr6e-4/seed_10"].epochs == 15000 and by_name["rms/lr6e-4/seed_1"].epochs == 15000
    assert by_name["sphere+fourier/lr6e-4/seed_1"].epochs == 5000
    assert by_name["sphere/lr6e-4/seed_1"].weight_decay == 1.0 and by_name["fb/lr6e-4/seed_1"].weight_decay == 0.0


def test_single_configuration_keeps_the_flat_layout(tmp_path):
    grid = make_grid(flags=dict(presets="fb", lr="6e-4", seeds="1-3"))
    assert _names(grid, tmp_path) == ["seed_1", "seed_2", "seed_3"]
    assert _names(make_grid(flags=dict(presets="fb", lr="6e-4", seeds="1", layout="nested")), tmp_path) == [
        "fb/lr6e-4/seed_1"]
    # once OUT holds a nested sweep, a one-configuration sweep into it is nested too
    (tmp_path / "sweep.json").write_text(json.dumps({"layout": "nested"}))
    assert _names(make_grid(flags=dict(presets="ln", seeds="2")), tmp_path) == ["ln/lr6e-4/seed_2"]
    with pytest.raises(GeoError, match="holds a nested sweep"):
        resolve_layout(make_grid(flags=dict(seeds="2", layout="flat")), tmp_path)
    with pytest.raises(GeoError, match="use --layout nested"):
        resolve_layout(make_grid(flags=dict(presets="fb,ln", seeds="2", layout="flat")), tmp_path / "new")


def test_a_flag_narrowing_a_grid_file_keeps_the_files_folders(tmp_path):
    # two sweeps of one two-preset grid file, one --preset each, into a fresh folder (as when each gets
    # a core): both land in the file's nested folders, never both in OUT/seed_<seed>
    grid_file = tmp_path / "mul.toml"
    grid_file.write_text('presets = ["fb", "sphere"]\nseeds = "1-2"\ntask = "mul"\nlr = 1e-4\n')
    out = tmp_path / "runs"
    assert make_grid(grid_file).file_configs == 2
    for preset in ("fb", "sphere"):
        narrowed = make_grid(grid_file, flags=dict(presets=preset))
        assert narrowed.n_configs == 1
        assert _names(narrowed, out) == [f"mul/{preset}/lr1e-4/seed_1", f"mul/{preset}/lr1e-4/seed_2"]
    # the file's per-preset budgets hold for the preset a flag keeps; an --epochs flag is still checked
    budgets = tmp_path / "budgets.toml"
    budgets.write_text('presets = ["ln", "rms", "fb"]\nseeds = "1"\n[epochs]\nln = 400\nrms = 300\ndefault = 50\n')
    assert make_grid(budgets, flags=dict(presets="rms")).epochs == {"ln": 400, "rms": 300, "*": 50}
    assert [m.cfg.epochs for m in expand(make_grid(budgets, flags=dict(presets="rms")), out, "nested")] == [300]
    with pytest.raises(GeoError, match="names preset 'ln', which is not in the grid"):
        make_grid(budgets, flags=dict(presets="rms", epochs="ln=5,6"))
    # a one-configuration file (or flags alone) stays flat
    one = tmp_path / "one.toml"
    one.write_text('presets = "fb"\nseeds = "1"\nlr = 6e-4\n')
    assert _names(make_grid(one), out) == ["seed_1"]
    assert _names(make_grid(one, flags=dict(presets="ln")), out) == ["seed_1"]


def test_further_levels_appear_when_their_axis_is_given(tmp_path):
    grid = make_grid(flags=dict(presets="fb,ln", lr="1e-3,0.01", wd="1,0.1", task="add,sub", p="23,29", seeds="1"),
                     sets=TINY_SET)
    names = _names(grid, tmp_path)
    assert len(names) == 2 * 2 * 2 * 2 * 2 and len(set(names)) == len(names)
    assert names[0] == "add/p23/fb/lr1e-3/wd1/seed_1"
    assert names[-1] == "sub/p29/ln/lr1e-2/wd0.1/seed_1"
    # a given axis keeps its level with a single value: the name does not depend on the rest of the grid
    one = make_grid(flags=dict(presets="fb", wd="0", seeds="1", layout="nested"))
    assert _names(one, tmp_path) == ["fb/lr6e-4/wd0/seed_1"]
    m = expand(grid, tmp_path, "nested")[-1]
    assert (m.cfg.task, m.cfg.p, m.cfg.preset, m.cfg.lr, m.cfg.weight_decay, m.cfg.d_model) == ("sub", 29, "ln", 0.01, 0.1, 32)


def test_number_labels_read_back():
    assert [number_label(x, scientific=True) for x in (6e-4, 1e-4, 1e-3, 0.01, 1.5e-3)] == [
        "6e-4", "1e-4", "1e-3", "1e-2", "1.5e-3"]
    assert [number_label(x) for x in (1.0, 0.0, 0.1, 0.3, 1e-4)] == ["1", "0", "0.1", "0.3", "1e-4"]
    for x in (6e-4, 0.1 + 0.2, 1 / 3, 123456.0, 2.5e-7):
        assert float(number_label(x, scientific=True)) == x and float(number_label(x)) == x


def test_per_preset_epochs():
    assert parse_epochs("5000", ["fb"]) == {"*": 5000}
    assert parse_epochs("ln=15000,rms=15000,5000", ["ln", "rms", "fb"]) == {"ln": 15000, "rms": 15000, "*": 5000}
    assert parse_epochs({"ln": 15000, "default": 5000}, ["ln"]) == {"ln": 15000, "*": 5000}
    grid = make_grid(flags=dict(presets="ln,fb", seeds="1", epochs="ln=300"))
    assert [m.cfg.epochs for m in expand(grid, "x", "nested")] == [300, 5000]  # fb: the config's default
    with pytest.raises(GeoError, match="preset 'lnn', which is not in the grid"):
        parse_epochs("lnn=10", ["ln"])
    for bad in ("ln=x", "10,20", "ln=5,ln=6", "-3"):
        with pytest.raises(GeoError, match="--epochs"):
            parse_epochs(bad, ["ln"])


def test_grid_file_and_flags(tmp_path):
    path = tmp_path / "table1.toml"
    path.write_text('presets = ["fb", "ln"]\nseeds = "1-2"\nlr = 6e-4\nearly_stop = 200\ncheckpoints = "ends"\n'
                    'frac = "0.5"\n[epochs]\nln = 300\ndefault = 100\n[set]\nd_mlp = 64\ncausal = true\n')
    grid = make_grid(path)
    members = expand(grid, tmp_path, resolve_layout(grid, tmp_path))
    assert [m.name for m in members] == ["fb/lr6e-4/seed_1", "fb/lr6e-4/seed_2", "ln/lr6e-4/seed_1", "ln/lr6e-4/seed_2"]
    assert [m.cfg.epochs for m in members] == [100, 100, 300, 300]
    assert {(m.cfg.d_mlp, m.cfg.checkpoints, m.cfg.early_stop_after, m.cfg.frac_train, m.cfg.causal)
            for m in members} == {(64, "ends", 200, 0.5, True)}  # values typed by their field
    # a flag replaces the file's key; --set adds to its [set] table
    grid = make_grid(path, dict(seeds="3", epochs="50"), ["d_head=8"])
    assert [(m.cfg.seed, m.cfg.epochs, m.cfg.d_head, m.cfg.d_mlp) for m in expand(grid, tmp_path, "nested")] == [
        (3, 50, 8, 64), (3, 50, 8, 64)]
    path.write_text('presets = ["fb"]\nseed = 3\n')
    with pytest.raises(GeoError, match=r"unknown key\(s\) \['seed'\]"):
        make_grid(path)
    path.write_text("presets = [fb]\n")
    with pytest.raises(GeoError, match="not valid TOML"):
        make_grid(path)


@pytest.mark.parametrize("flags,sets,needle", [
    (dict(presets="fb,nope", seeds="1"), [], "unknown preset 'nope'"),
    (dict(presets="fb", seeds="1,1"), [], "--seeds"),
    (dict(presets="fb"), [], "needs seeds"),
    (dict(presets="fb", seeds="1", lr="6e-4,6e-4"), [], "none twice"),
    (dict(presets="fb", seeds="1", lr="fast"), [], "--lr 'fast' must be comma-separated float"),
    (dict(presets="fb", seeds="1"), ["lr=1e-3"], "'lr' is a sweep axis; give it with --lr"),
    (dict(presets="fb", seeds="1", layout="deep"), [], "layout 'deep'"),
])
def test_bad_grids_are_refused_in_one_line(flags, sets, needle):
    with pytest.raises(GeoError, match=needle) as info:
        make_grid(flags=flags, sets=sets)
    assert "\n" not in str(info.value)


def test_bad_member_config_fails_before_anything_runs(tmp_path):
    grid = make_grid(flags=dict(presets="fb", seeds="1", p="23,25"))
    with pytest.raises(GeoError, match="p = 25 is not prime"):
        run_sweep(grid, tmp_path / "sw", progress=False)
    assert not (tmp_path / "sw").exists()


def test_ends_schedule_saves_only_the_first_and_last_state(tmp_path):
    ends = parse_schedule("ends")
    assert ends.wants(0, None, {}) and not ends.wants(500, {"step": 0}, {"test_acc": 1.0, "test_loss": 0.0})
    with pytest.raises(GeoError, match="ends"):
        parse_schedule("ends:5")
    cfg = make_config("fb", seed=1, epochs=30, checkpoints="ends", **TINY)
    train_batched([cfg], [tmp_path / "m"], progress=False)
    manifest = json.loads((tmp_path / "m" / "checkpoints" / "manifest.json").read_text())
    assert [e["step"] for e in manifest] == [0, 30]


# ---- members on disk ----------------------------------------------------------------------------
def _member(tmp_path, name="m", **changes):
    cfg = make_config("ln", **{"seed": 1, "data_seed": 1, **TINY, "epochs": 20, "checkpoints": "every:10", **changes})
    return Member(name, cfg, tmp_path / name)


def test_member_states(tmp_path, monkeypatch):
    import geolens.training.batched as batched

    m = _member(tmp_path)
    inspect_member(m)
    assert m.state == "new"
    train_batched([m.cfg], [m.path], progress=False)
    inspect_member(m)
    assert m.state == "done"
    inspect_member(m, force=True)
    assert m.state == "restart"
    # a different config is refused naming the field, whichever side it differs on
    for change, needle in ((dict(epochs=10), "epochs = 20 but the sweep asks for 10"), (dict(lr=1e-3), "lr = "),
                           (dict(d_mlp=32), "d_mlp = 64 but the sweep asks for 32")):
        with pytest.raises(GeoError, match=needle) as info:
            inspect_member(_member(tmp_path, **change))
        assert "never overwritten" in str(info.value) and "\n" not in str(info.value)
    # killed between checkpoints: resumed from its resume state
    real = batched._evaluate

    def dying(forward, models, probes, e, *args):
        if e == 15:
            raise KeyboardInterrupt
        return real(forward, models, probes, e, *args)

    k = _member(tmp_path, "killed")
    monkeypatch.setattr(batched, "_evaluate", dying)
    with pytest.raises(KeyboardInterrupt):
        train_batched([k.cfg], [k.path], progress=False)
    monkeypatch.setattr(batched, "_evaluate", real)
    inspect_member(k)
    assert (k.state, k.start) == ("resume", 10)
    # its budget may be lowered while it is still before it (resumed to stop sooner), not to or below it
    lowered = _member(tmp_path, "killed", epochs=15)
    inspect_member(lowered)
    assert (lowered.state, lowered.start) == ("resume", 10)
    with pytest.raises(GeoError, match="has trained to epoch 10 under its budget of 20 epochs, so the sweep's 10 cannot"):
        inspect_member(_member(tmp_path, "killed", epochs=10))
    # without a resume state: restarted
    (k.path / "resume.safetensors").unlink()
    inspect_member(k)
    assert k.state == "restart"
    # a folder that is not a run is refused
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("x")
    with pytest.raises(GeoError, match="not a geolens run"):
        inspect_member(_member(tmp_path, "junk"))


def test_member_killed_after_its_last_checkpoint_is_finished_without_training(tmp_path):
    from geolens.runs.run import load_run
    from geolens.sweeps.sweep import finish_member

    m = _member(tmp_path)
    train_batched([m.cfg], [m.path], progress=False)
    header = json.loads((m.path / "run.json").read_text())
    events = json.loads((m.path / "events.json").read_text())
    # as if killed before the final records: status running, events without the stop
    (m.path / "run.json").write_text(json.dumps({**header, "status": "running"}))
    (m.path / "events.json").write_text(json.dumps({"onset_095": None, "sustained_099": None, "eval_every": 5}))
    inspect_member(m)
    assert (m.state, m.start) == ("finish", 20)
    finish_member(m.path)
    run = load_run(m.path)
    assert run.header["status"] == "finished" and run.header["stop_reason"] == "completed"
    assert run.events == events


def test_a_raised_budget_extends_finished_members_bit_for_bit(tmp_path, assert_identical_runs):
    from geolens.runs.storage import read_metrics, write_metrics
    from geolens.sweeps.sweep import run_job

    short = [_member(tmp_path / "short", f"seed_{s}", seed=s, data_seed=s) for s in (1, 2)]
    train_batched([m.cfg for m in short], [m.path for m in short], progress=False, min_stack=2)
    members = [_member(tmp_path / "short", f"seed_{s}", seed=s, data_seed=s, epochs=40) for s in (1, 2)]
    for m in members:
        inspect_member(m)
        assert (m.state, m.start) == ("resume", 20)
    [job] = plan_jobs(members, workers=1)
    assert (job.kind, job.cost) == ("resume", 2 * 20)
    run_job(job)
    whole = [_member(tmp_path / "whole", f"seed_{s}", seed=s, data_seed=s, epochs=40) for s in (1, 2)]
    train_batched([m.cfg for m in whole], [m.path for m in whole], progress=False, min_stack=2)
    for m, w in zip(members, whole):
        assert_identical_runs(m.path, w.path)
        segments = json.loads((m.path / "run.json").read_text())["segments"]
        assert [seg["from_epoch"] for seg in segments] == [0, 20]
        inspect_member(m)
        assert m.state == "done"
    # a member that stopped early stays done under a larger budget
    stopped = _member(tmp_path, "stopped", early_stop_after=5)
    train_batched([stopped.cfg], [stopped.path], progress=False)
    rows = read_metrics(stopped.path / "metrics.csv")
    write_metrics(stopped.path / "metrics.csv", [{**r, "test_acc": 1.0} for r in rows])
    longer = _member(tmp_path, "stopped", early_stop_after=5, epochs=40)
    inspect_member(longer)
    assert longer.state == "done"
    # without a resume state a finished member cannot be extended: refused in one line
    (members[0].path / "resume.safetensors").unlink()
    with pytest.raises(GeoError, match="no resume state to extend it to 80"):
        inspect_member(_member(tmp_path / "short", "seed_1", epochs=80))


def test_a_lowered_budget_stops_a_killed_member_sooner_as_if_trained_to_it(tmp_path, monkeypatch,
                                                                          assert_identical_runs):
    # a member killed at epoch 15 of 20 (resume state at 10), rerun by a sweep asking for 15 epochs:
    # the run trained to 15 in one go, and then done under that budget
    import geolens.training.batched as batched
    from geolens.sweeps.sweep import run_job

    real = batched._evaluate

    def dying(forward, models, probes, e, *args):
        if e == 15:
            raise KeyboardInterrupt
        return real(forward, models, probes, e, *args)

    killed = _member(tmp_path / "killed", "seed_1")
    monkeypatch.setattr(batched, "_evaluate", dying)
    with pytest.raises(KeyboardInterrupt):
        train_batched([killed.cfg], [killed.path], progress=False, min_stack=2)  # as a sweep stacks
    monkeypatch.setattr(batched, "_evaluate", real)
    lowered = _member(tmp_path / "killed", "seed_1", epochs=15)
    inspect_member(lowered)
    [job] = plan_jobs([lowered], workers=1)
    run_job(job)
    whole = _member(tmp_path / "whole", "seed_1", epochs=15)
    train_batched([whole.cfg], [whole.path], progress=False, min_stack=2)
    assert_identical_runs(lowered.path, whole.path)
    inspect_member(lowered)
    assert lowered.state == "done"


def test_plan_groups_stackable_members_and_balances_workers(tmp_path):
    grid = make_grid(flags=dict(presets="fb,ln", lr="1e-3,3e-3", seeds="1-5", epochs="ln=300,100"), sets=TINY_SET)
    members = expand(grid, tmp_path, "nested")
    jobs = plan_jobs(members, workers=1)
    # lr may differ inside a stack, the preset's shape (norm) may not: one job per preset
    assert sorted((len(j.members), j.members[0].cfg.preset) for j in jobs) == [(10, "fb"), (10, "ln")]
    assert jobs[0].members[0].cfg.preset == "ln"  # the largest job (more epochs) first
    jobs = plan_jobs(members, workers=3)
    assert sorted(len(j.members) for j in jobs) == [3, 3, 3, 3, 4, 4]
    assert sorted(m.name for j in jobs for m in j.members) == sorted(m.name for m in members)
    # resumed members stack only with members at the same epoch; finished ones are not planned
    members[0].state, members[1].state, members[2].state = "done", "resume", "resume"
    members[1].start, members[2].start = 40, 60
    members[3].state = "finish"
    jobs = plan_jobs(members[:5], workers=4)
    assert sorted((j.kind, [m.name for m in j.members]) for j in jobs) == [
        ("finish", ["fb/lr1e-3/seed_4"]), ("resume", ["fb/lr1e-3/seed_2"]), ("resume", ["fb/lr1e-3/seed_3"]),
        ("train", ["fb/lr1e-3/seed_5"])]
    assert Job("resume", [members[1]]).cost == 2 * (100 - 40)  # a lone member is stacked with a copy


def test_chunks():
    assert chunks(list(range(5)), 1) == [[0, 1, 2, 3, 4]]
    assert chunks(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert chunks(list(range(5)), 8) == [[0, 1, 2], [3, 4]]  # at least two members a chunk
    assert chunks([0], 4) == [[0]]
    assert chunks(list(range(10)), 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_one_configuration_sweeps_are_recognised_by_the_grid(tmp_path):
    # members written as the one-configuration command wrote them: geolens sweep --preset P --lr 6e-4
    # --seeds 1-2 ... --out OUT/P/lr6e-4 made make_config(P, lr=6e-4, ..., seed=s, data_seed=s) into seed_<s>
    # (p = 113 with a small model: --p would add a p<p> level)
    small = dict(d_model=32, n_heads=4, d_head=8, d_mlp=64)
    for preset in ("fb", "ln"):
        cfgs = [make_config(preset, lr=6e-4, epochs=4, eval_every=2, early_stop_after=200, checkpoints="every:2",
                            seed=s, data_seed=s, **small) for s in (1, 2)]
        train_batched(cfgs, [tmp_path / preset / "lr6e-4" / f"seed_{s}" for s in (1, 2)], progress=False)
    flags = dict(lr="6e-4", seeds="1-2", epochs="4", eval_every=2, early_stop=200, checkpoints="every:2")
    grid = make_grid(flags={**flags, "presets": "fb,ln"}, sets=TINY_SET)
    result = run_sweep(grid, tmp_path, progress=False)
    assert result.status == {f"{p}/lr6e-4/seed_{s}": "skipped" for p in ("fb", "ln") for s in (1, 2)}
    # the one-configuration form still finds them in its flat layout
    flat = make_grid(flags={**flags, "presets": "fb"}, sets=TINY_SET)
    assert run_sweep(flat, tmp_path / "fb" / "lr6e-4", progress=False).status == {"seed_1": "skipped",
                                                                                 "seed_2": "skipped"}
    # a lowered budget is refused, naming the field
    with pytest.raises(GeoError, match="epochs = 4 but the sweep asks for 2"):
        run_sweep(make_grid(flags={**flags, "presets": "fb,ln", "epochs": "ln=2,4"}, sets=TINY_SET), tmp_path,
                  progress=False)
