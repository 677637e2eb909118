"""Precursors of the onset: event rules and lead statistics on constructed series whose answers are known,
and `geolens precursors` on constructed runs."""

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import one_line_error

from geolens.analysis.precursors import PRECURSORS, event_epoch, lead_stats
from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.runs.storage import RunDir, write_metrics


@pytest.mark.parametrize("values, rule, expected", [
    ([0, 1, 3, 2, 1], "peak", 20),          # the maximum, confirmed by the fall to 2 (by 1 >= 0.2 x 3)
    ([0, 3, 1, 3, 0], "peak", 10),          # the first maximum confirmed
    ([0, 10, 9, 12, 5], "peak", 30),        # 10 -> 9 falls back by 1 < 0.2 x 10: not a peak; 12 is
    ([0, 10, 8, 12, 5], "peak", 10),        # 10 -> 8 falls back by 0.2 x 10: confirmed, later values do not matter
    ([0, 1, 2, 3, 4], "peak", None),        # still rising at the end: no peak
    ([4, 3, 2, 1, 0], "peak", None),        # falling from the start: no peak
    ([5, 2, 4, 1, 3], "trough", 10),        # 5 -> 2, back up to 4 (by 2 >= 0.2 x 3): the collapse at 10
    ([1, 2, 3, 4, 5], "trough", None),
    ([None, None, 3, 1, 3], "trough", 30),  # rows without the column are not part of the series
    ([None, None, None, None, 3], "peak", None),
    ([10, 9, 6, 4, 0], "crossing:0.5", 30),  # 10 -> 0: half the change is covered at 4 (epoch 30)
    ([0, 1, 5, 9, 10], "crossing:0.5", 20),
    ([2, 2, 2, 2, 2], "crossing:0.5", None),  # no change, no crossing
])
def test_event_rules(values, rule, expected):
    assert event_epoch([0, 10, 20, 30, 40], values, rule) == expected


def test_an_unknown_rule_is_refused():
    for rule in ("valley", "crossing:2", "crossing:x"):
        with pytest.raises(GeoError, match=f"unknown event rule '{rule}'"):
            event_epoch([0, 10], [1, 2], rule)


def test_lead_statistics_of_known_pairs():
    # events 800, 1,700, 2,600 before onsets 1,000, 2,000, 3,000: leads 200, 300, 400, an exact line
    s = lead_stats("x", [(1000, 800), (2000, 1700), (3000, 2600), (4000, None)])
    assert (s.runs, s.with_event, s.precedes, s.lead_median, s.lead_iqr) == (4, 3, 1.0, 300, (250.0, 350.0))
    assert s.spearman == pytest.approx(1.0) and s.loo_error == pytest.approx(0.0)
    assert s.loo_baseline == pytest.approx(1000.0)  # |1000 - 2500|, |2000 - 2000|, |3000 - 1500|
    # events after the onset, in reverse order: no lead, a perfect negative rank correlation
    s = lead_stats("y", [(1000, 3500), (2000, 3300), (3000, 3200)])
    assert s.precedes == 0.0 and s.lead_median == -1300 and s.spearman == pytest.approx(-1.0)
    # too few runs for correlation and prediction; no events at all
    s = lead_stats("z", [(1000, 900), (2000, 1800)])
    assert s.spearman is None and s.loo_error is None and s.lead_median == 150
    assert lead_stats("w", [(1000, None)]).precedes is None


def _run(path, seed, onset, gap_peak, epochs=3000):
    """A finished run whose test accuracy passes 0.95 at `onset` and whose test loss peaks at `gap_peak`."""
    from geolens.runs.events import finish_events

    run = RunDir(path)
    run.path.mkdir(parents=True)
    cfg = make_config("ln", p=23, seed=seed, data_seed=seed, epochs=epochs)
    run.write_header({"config": cfg.to_dict(), "engine": "fast", "n_train": 1, "n_test": 1, "status": "finished",
                      "stop_reason": "completed"})
    rows = [{"epoch": e, "train_loss": 0.01, "train_acc": 1.0, "test_loss": 5.0 - abs(e - gap_peak) / 1000,
             "test_acc": 0.97 if e >= onset else 0.1, "weight_norm": 10.0 + e / 1000, "grad_norm": 0.1,
             "max_abs_logit": min(e, onset) / 100, "elapsed_s": 0.0,
             "attn_var": 1.0 + max(0.0, 1 - abs(e - (onset - 300)) / 200),  # a bump peaking 300 epochs before
             "participation_mlp": 20.0 - 10 * max(0.0, 1 - abs(e - (onset - 100)) / 100)}
            for e in range(0, epochs + 1, 10)]
    write_metrics(run.metrics_csv, rows)
    from geolens.runs.storage import atomic_write_json

    atomic_write_json(run.events_json, finish_events(rows, "completed", 10))


def test_precursors_command_on_constructed_runs(tmp_path, geolens):
    for seed, onset, peak in ((1, 1000, 600), (2, 2000, 1500), (3, 1500, 1100)):
        _run(tmp_path / "runs" / f"seed_{seed}", seed, onset, peak)
    r = geolens("precursors", "--runs", tmp_path / "runs", "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "out" / "precursors.md").read_text().splitlines()
    rows = {line.split(" | ")[1]: line.split(" | ") for line in md if line.startswith("| ln")}
    recorded = {"test_loss", "loss_gap", "weight_norm", "logit_scale", "attn_var", "participation_mlp"}
    assert set(rows) == recorded  # the precursors these runs hold columns for
    # test loss peaks at 600 / 1,500 / 1,100 before onsets 1,000 / 2,000 / 1,500: leads 400, 500, 400
    assert rows["test_loss"][3:8] == ["3", "3", "1.00", "400", "400 to 450"] and rows["test_loss"][9] == "+1.00"
    assert rows["test_loss"][8] == "400 to 500 (75%)"  # three leads: their range, which covers the median 75%
    # three runs: 3! = 6 pairings, two of them as extreme as a perfect rank correlation: p = 1/3, survives nothing
    assert rows["test_loss"][10:13] == ["0.333", "1", "no"]
    # the weight norm grows to the end: no peak in any run
    assert rows["weight_norm"][4:6] == ["0", "-"]
    # the logit scale rises until the onset and then holds: it crosses half its change at half the onset
    assert rows["logit_scale"][6] == "750"
    assert rows["attn_var"][3:8] == ["3", "3", "1.00", "300", "300 to 300"]  # the bump's top
    assert rows["attn_var"][8:10] == ["300 to 300 (75%)", "+1.00"]
    assert rows["participation_mlp"][2:7] == ["trough", "3", "3", "1.00", "100"]  # the collapse's bottom
    from geolens.outputs.plots import Line
    from geolens.outputs.precursor_table import fig_precursors, load_groups, precursor_rows

    spec = fig_precursors(precursor_rows(*load_groups(tmp_path / "runs"))[2])
    assert spec.cols == 1 and [p.title.split(" (")[0] for p in spec.panels] == [
        p.name for p in PRECURSORS if p.name in recorded]  # a panel per recorded precursor, one configuration
    panel = next(p for p in spec.panels if p.title.startswith("test_loss (peak)"))
    seeds = [t for t in panel.traces if isinstance(t, Line) and t.name == "seed"]
    events = [t for t in panel.traces if isinstance(t, Line) and t.name == "event"]
    assert len(seeds) == 3 and len(events) == 3
    for t in seeds:  # the peak (1.0 after scaling) is 400 or 500 epochs before the onset (x = 0)
        assert max(t.y) == 1.0 and t.x[t.y.index(1.0)] in (-400, -500) and min(t.y) == 0.0
    assert sorted(e.x[0] for e in events) == [-500, -400, -400] and all(e.y == [1.0] for e in events)
    assert not [t for t in next(p for p in spec.panels if p.title.startswith("weight_norm")).traces
                if isinstance(t, Line) and t.name == "event"]  # no peak: no marker
    assert (tmp_path / "out" / "precursors.png").stat().st_size > 0
    csv_lines = (tmp_path / "out" / "precursors.csv").read_text().splitlines()
    assert csv_lines[0].startswith("configuration,precursor,rule,runs") and len(csv_lines) == 1 + len(recorded)


def test_runs_recorded_under_the_old_column_names_give_the_same_tables(tmp_path, geolens):
    """Runs whose metrics.csv says erank_mlp (the participation ratio's name before) give the tables of the same
    runs recorded as participation_mlp, and `--columns erank_mlp` reads that column with a note."""
    for seed, onset, peak in ((1, 1000, 600), (2, 2000, 1500), (3, 1500, 1100)):
        for name in ("new", "old"):
            _run(tmp_path / name / f"seed_{seed}", seed, onset, peak)
        old = tmp_path / "old" / f"seed_{seed}" / "metrics.csv"
        old.write_text(old.read_text().replace("participation_mlp", "erank_mlp"))
    assert "erank_mlp" in old.read_text().splitlines()[0]
    out = {}
    for name, columns in (("new", "participation_mlp,attn_var"), ("old", "erank_mlp,attn_var")):
        r = geolens("precursors", "--runs", tmp_path / name, "--out", tmp_path / f"out_{name}", "--online",
                    "--min-warning", "50", "--columns", columns)
        assert r.returncode == 0, r.stderr
        out[name] = [(tmp_path / f"out_{name}" / f).read_text().replace(f"out_{name}", "").replace(f"/{name}", "")
                     for f in ("precursors.md", "precursors_online.md")]
        notes = [line for line in r.stderr.splitlines() if line.startswith("note:")]
        assert notes == ([] if name == "new" else ["note: --columns erank_mlp is the column now called participation_mlp "
                                                   "(docs/metrics.md, \"Precursor columns\"); reading it as that"])
    assert out["old"] == out["new"] and "| participation_mlp |" in out["old"][1] and "erank" not in "".join(out["old"])


def test_precursors_without_runs_is_one_line(tmp_path, geolens):
    (tmp_path / "empty").mkdir()
    r = geolens("precursors", "--runs", tmp_path / "empty")
    assert r.returncode == 2 and "no finished run directory" in one_line_error(r.stderr)


EMBEDDED_TABLES = 11  # W_L's crossing, docs/precursors.md: add offline, side by side, the column choice at warnings 100 and 500, the alarms at 100, add online at 100 and 500, the prospective check, mul offline and online


def test_the_committed_precursor_tables_are_what_the_code_computes(tmp_path, monkeypatch):
    """results/precursors/{add,mul} are `geolens precursors` on the committed runs of docs/precursors.md
    with this code, and docs/precursors.md shows the committed tables."""
    import importlib.util

    from conftest import REPO

    from geolens.outputs.precursor_table import (ALARM_COLUMNS, ONLINE_COLUMNS, SELECTION_COLUMNS, alarm_rows,
                                                 load_groups, nongrokking_runs, online_rows, precursor_rows,
                                                 selection_rows, write_precursor_table)
    from geolens.runs.forecast import read_forecasts, write_forecasts

    nongrokking = Path("results/depth/records/add/L1")  # tables.sh's --nongrokking for addition
    for grid, folder, warning in (("add", "add", 100), ("mul", "mul", 100), ("add", "add/warning500", 500)):
        monkeypatch.chdir(REPO)  # the tables name runs by the relative paths tables.sh passes
        records, committed = Path("results/precursors/records") / grid, REPO / "results" / "precursors" / folder
        groups, found = load_groups(records)
        if folder == grid:
            rows, notes, _ = precursor_rows(groups, found)
            write_precursor_table(rows, notes, tmp_path / folder)
            assert (tmp_path / folder / "precursors.md").read_text() == (committed / "precursors.md").read_text()
        more, more_found = load_groups(nongrokking) if grid == "add" else ([], [])
        negatives = nongrokking_runs(groups, more)
        found += [f"runs that did not grok ({nongrokking}): {note}" for note in more_found]
        rows, notes, forecasts = online_rows(groups, found, warning, None, negatives)
        written = write_precursor_table(rows, notes, tmp_path / folder, "precursors_online", ONLINE_COLUMNS)
        written += write_precursor_table(*selection_rows(groups, forecasts, warning), tmp_path / folder,
                                         "precursors_online_selection", SELECTION_COLUMNS)
        written += write_precursor_table(*alarm_rows(groups, forecasts, negatives, warning), tmp_path / folder,
                                         "precursors_alarms", ALARM_COLUMNS)
        for path in written:
            assert path.read_text() == (committed / path.name).read_text(), path.name
        write_forecasts(tmp_path / folder / "forecast.json", forecasts, warning)
        ours, theirs = read_forecasts(tmp_path / folder / "forecast.json"), read_forecasts(committed / "forecast.json")
        assert [replace(f, key="") for f in ours] == [replace(f, key="") for f in theirs]
        assert all(f.matches(g.key) for f, g in zip(ours, theirs))  # keys: the same configuration, field by field
    from geolens.outputs.precursor_table import CHECK_COLUMNS, check_rows

    rows, notes = check_rows(*load_groups(Path("results/precursors/prospective")), Path("results/precursors/add/forecast.json"))
    write_precursor_table(rows, notes, tmp_path / "check", "forecast_check", CHECK_COLUMNS)
    committed = REPO / "results" / "precursors" / "prospective" / "check" / "forecast_check.md"
    assert (tmp_path / "check" / "forecast_check.md").read_text() == committed.read_text()
    crossing = importlib.util.spec_from_file_location("crossing", REPO / "analyses" / "precursors" / "at_crossing.py")
    at_crossing = importlib.util.module_from_spec(crossing)
    crossing.loader.exec_module(at_crossing)
    table = at_crossing.at_crossing(REPO / "results" / "precursors" / "records" / "add")
    assert table == (REPO / "results" / "precursors" / "add" / "at_crossing.md").read_text()
    assert "| ln lr 0.0006 wd 1, add p=113 | 10 | 0.05-0.25 | 3.0-4.9 | 7.0-8.4 |" in table  # the doc's numbers
    side = importlib.util.spec_from_file_location("side", REPO / "analyses" / "precursors" / "side_by_side.py")
    side_by_side = importlib.util.module_from_spec(side)
    side.loader.exec_module(side_by_side)
    add = REPO / "results" / "precursors" / "add"
    assert side_by_side.side_by_side(side_by_side.read(add / "precursors.csv"), [
        (100, side_by_side.read(add / "precursors_online.csv")),
        (500, side_by_side.read(add / "warning500" / "precursors_online.csv"))]) == (add / "side_by_side.md").read_text()
    spec = importlib.util.spec_from_file_location("embed", REPO / "analyses" / "reproduction" / "embed_tables.py")
    embed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(embed)
    doc = (REPO / "docs" / "precursors.md").read_text()
    assert embed.embed(doc) == (doc, EMBEDDED_TABLES)


def test_the_llc_joins_the_precursors_where_checkpoints_are_dense_enough(tmp_path, monkeypatch):
    """A run whose analysis cache holds the LLC at enough checkpoints gets an `llc` series at those epochs (its
    peak rule then gives the event); with fewer than MIN_CHECKPOINTS it gets none; unstable estimates, estimates at
    a less shared setting and those inside a loss spike are left out, and so are estimates today's judge has not
    passed (no llc_rhat: the old rule's verdict, its trace not kept; no llc_stable: never judged)."""
    from geolens.analysis import precursors as prec
    from geolens.analysis import trajectory
    from geolens.model.config import make_config
    from geolens.runs.run import load_run
    from geolens.training import train as training

    cfg = make_config("fb", p=11, d_model=16, n_heads=2, d_head=8, d_mlp=32, frac_train=0.5, epochs=80,
                      eval_every=10, checkpoints="every:10")
    training.train(cfg, tmp_path / "r", progress=False)
    run = load_run(tmp_path / "r")
    llc = {0: 1.0, 10: 3.0, 20: 6.0, 30: 9.0, 40: 7.0, 50: 5.0, 60: 4.0, 70: 3.5, 80: 3.0}  # peak at 30
    passed = {"llc_stable": 1.0, "llc_rhat": 1.01}  # today's judge passed it
    monkeypatch.setattr(trajectory, "cached_metrics",
                        lambda r, step, names: {"llc": {"llc": llc[step], **passed}} if step in llc else {})
    rows = prec.series_rows(run)
    assert [(int(r["epoch"]), r.get("llc")) for r in rows if "llc" in r] == sorted(llc.items())
    assert prec.run_events(run)["llc"] == 30
    for verdict in ({"llc_stable": 1.0}, {}):  # the old rule's verdict (no llc_rhat), or none: no series
        monkeypatch.setattr(trajectory, "cached_metrics",
                            lambda r, step, names: {"llc": {"llc": llc[step], **verdict}} if step in llc else {})
        assert all("llc" not in r for r in prec.series_rows(run)) and prec.run_events(run)["llc"] is None
    sparse = {k: v for k, v in llc.items() if k < 40}  # 4 checkpoints: too few
    monkeypatch.setattr(trajectory, "cached_metrics",
                        lambda r, step, names: {"llc": {"llc": sparse[step], **passed}} if step in sparse else {})
    assert all("llc" not in r for r in prec.series_rows(run)) and prec.run_events(run)["llc"] is None
    # an estimate judged unstable is left out (here the largest: the peak moves), and so are estimates at a
    # setting fewer checkpoints share
    judged = {k: {"llc": v, "llc_stable": 0.0 if k == 30 else 1.0, "llc_rhat": 1.01, "llc_setting_lr": 1e-7}
              for k, v in llc.items()}
    judged[80]["llc_setting_lr"] = 1e-5
    monkeypatch.setattr(trajectory, "cached_metrics",
                        lambda r, step, names: {"llc": judged[step]} if step in judged else {})
    rows = prec.series_rows(run)
    assert [int(r["epoch"]) for r in rows if "llc" in r] == [0, 10, 20, 40, 50, 60, 70]
    assert prec.run_events(run)["llc"] == 40
    # so is an estimate at a checkpoint inside a loss spike of the record (training accuracy lost after it was
    # reached: 30), not one before the first fit (0)
    run.metrics = [{**r, "train_acc": 0.5 if int(r["epoch"]) in (0, 30) else 1.0} for r in run.metrics]
    monkeypatch.setattr(trajectory, "cached_metrics",
                        lambda r, step, names: {"llc": {"llc": llc[step], **passed}} if step in llc else {})
    rows = prec.series_rows(run)
    assert [int(r["epoch"]) for r in rows if "llc" in r] == [0, 10, 20, 40, 50, 60, 70, 80]
    assert prec.run_events(run)["llc"] == 40
