"""analyses/landscape/muon_table.py: what a run's onset and its hold after the onset are, the cells, and the tests
on constructed runs; the committed Muon table is what the committed records give, and docs/landscape.md shows it."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _table():
    spec = importlib.util.spec_from_file_location("muon_table", ROOT / "analyses" / "landscape" / "muon_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["muon_table"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def _rows(accs, every=100):
    return [{"epoch": i * every, "test_acc": a} for i, a in enumerate(accs)]


def test_a_run_that_loses_generalisation_after_the_onset():
    t = _table()
    kept = t.measure(_rows([0.1, 0.5, 0.97, 0.995, 0.999, 1.0]), "early_stop")
    assert kept == t.MuonRun(onset=200, held=True, worst_after=0.995, final_epoch=500)
    lost = t.measure(_rows([0.1, 0.96, 0.995, 0.97, 0.6, 0.992]), "completed")
    assert lost.onset == 100 and not lost.held and lost.worst_after == 0.6
    never = t.measure(_rows([0.1, 0.2, 0.3]), "completed")
    assert never == t.MuonRun(onset=None, held=False, worst_after=None, final_epoch=200)
    assert t.held_cell([kept, lost, never]) == "1 of 3; lowest test acc after 0.99: 0.600"


def test_the_tests_are_two_sided_and_holm_corrected_over_the_presets(tmp_path, monkeypatch):
    """Constructed onsets: per preset one two-sided test (Muon and AdamW differ), Holm over the presets."""
    t = _table()
    run = lambda onset: t.MuonRun(onset, True, 1.0, 9000)  # noqa: E731
    data = {("ln", "adamw"): [run(o) for o in (7000, 7100, 7200)], ("ln", "muon"): [run(o) for o in (3000, 3100, 3200)],
            ("fb", "adamw"): [run(o) for o in (1000, 1300, 1100)], ("fb", "muon"): [run(o) for o in (1200, 900, None)]}
    monkeypatch.setattr(t, "collect", lambda root: (data, []))
    table, tests = t.build(tmp_path)
    assert "(range 3,000-3,200; n=3)" in table and "95%" not in table
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in tests.splitlines() if line.startswith("| ln") or line.startswith("| fb")}
    assert rows["ln"][:3] == ["muon and adamw differ", "3 vs 3", "0.1"]  # 3 vs 3 separated: twice 1/20
    p_fb = t.onsets_differ([1200, 900, None], [1000, 1300, 1100])
    assert rows["ln"][3] == "0.2 |" and rows["fb"][3] == "1 |" and p_fb > 0.5  # Holm over the 2 presets
    assert "corrected over the 2 tests of this table" in tests


@pytest.mark.skipif(not (ROOT / "results" / "landscape" / "records" / "muon").is_dir(), reason="no committed Muon records")
def test_the_committed_muon_table_is_what_the_records_give(monkeypatch):
    monkeypatch.chdir(ROOT)  # the table's notes name the records by their relative paths
    table, tests = _table().build(Path("results/landscape/records/muon"))
    assert table == (ROOT / "results" / "landscape" / "muon_table.md").read_text()
    assert tests == (ROOT / "results" / "landscape" / "muon_tests.md").read_text()
    spec = importlib.util.spec_from_file_location("embed", ROOT / "analyses" / "reproduction" / "embed_tables.py")
    embed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(embed)
    text = (ROOT / "docs" / "landscape.md").read_text()
    refreshed, _ = embed.embed(text)
    assert "results/landscape/muon_table.md" in text and refreshed == text  # rerun embed_tables.py docs/landscape.md
