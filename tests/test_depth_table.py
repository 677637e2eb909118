"""analyses/depth/table.py: configuration names, onset cells and the Mann-Whitney tests on constructed onsets;
the committed depth table is what the committed records give, and docs/depth.md shows it."""

import importlib.util
from pathlib import Path

import pytest

from geolens.model.config import make_config

ROOT = Path(__file__).resolve().parent.parent


def _table():
    spec = importlib.util.spec_from_file_location("depth_table", ROOT / "analyses" / "depth" / "table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_names_follow_run_cpu_sh():
    t = _table()
    assert t.config_key(make_config("ln")) == "ln_post"
    assert t.config_key(make_config("rms", norm_placement="pre")) == "rms_pre"
    assert t.config_key(make_config("fb")) == "fb_post" and t.config_key(make_config("sphere")) == "sphere_post"
    assert t.config_key(make_config("sphere", n_layers=2, norm="sphere,layernorm")) == "sphere_ln_post"


def test_cells_and_tests_on_constructed_onsets():
    t = _table()
    assert t.cell(None) == "-"
    assert t.cell([(None, 5000), (None, 5000)]) == "none of 2; 2 without onset (budget 5,000)"
    assert t.cell([(1000, 1200)]) == "1,000 (n=1)"
    assert t.cell([(1000, 1200), (3000, 3200)]) == "2,000 ± 1,414 (range 1,000-3,000; n=2)"  # a range, not a 95% CI
    # two seeds each, all of a's onsets before b's: the exact one-sided p is 1 / C(4, 2), the two-sided twice that
    assert t.earlier([(100, 0), (200, 0)], [(300, 0), (400, 0)]) == pytest.approx(1 / 6)
    assert t.differ([(300, 0), (400, 0)], [(100, 0), (200, 0)]) == pytest.approx(2 / 6)
    # a seed without an onset ranks after every onset
    assert t.earlier([(100, 0), (None, 900)], [(300, 0), (400, 0)]) == t.earlier([(100, 0), (500, 0)], [(300, 0), (400, 0)])
    assert t.earlier([(100, 0)], [(300, 0), (400, 0)]) is None


def test_every_test_of_the_table_is_holm_corrected_and_both_way_questions_are_two_sided(tmp_path, monkeypatch):
    """Constructed onsets of five configurations: the table's one-sided and two-sided tests, each with its
    Holm-corrected p-value over the whole table (one family); the device family on its own."""
    t = _table()
    five = lambda start, step=100: [(start + i * step, 20000) for i in range(5)]  # noqa: E731
    data = {("add p=113", "ln_post", 1): five(7000), ("add p=113", "sphere_post", 1): five(700),
            ("add p=113", "ln_post", 2): five(6500), ("add p=113", "sphere_post", 2): five(2000),
            ("add p=113", "sphere_ln_post", 2): five(4000), ("add p=113", "ln_sphere_post", 2): five(5500)}
    devices = {k: ["CPU"] * 5 for k in data}
    monkeypatch.setattr(t, "collect", lambda root: (data, devices, []))
    _, tests = t.build(tmp_path)
    rows = {tuple(line.split(" | ")[1:3]): line.split(" | ")[3:5] for line in tests.splitlines() if line.startswith("| add")}
    floor = 1 / 252  # 5 against 5, every onset of one before every onset of the other
    assert rows[("sphere_post earlier than ln_post", "1")] == ["one", f"{floor:.3g}"]
    assert rows[("sphere_post earlier than ln_post", "2")] == ["one", f"{floor:.3g}"]
    assert rows[("sphere_ln_post and ln_sphere_post differ", "2")] == ["two", f"{2 * floor:.3g}"]
    assert ("sphere_ln_post earlier than ln_sphere_post", "2") not in rows  # asked both ways: one two-sided test
    assert ("ln_sphere_post earlier than sphere_ln_post", "2") not in rows
    assert rows[("sphere_post: 1 and 2 layers differ", "2 vs 1")] == ["two", f"{2 * floor:.3g}"]
    assert not any("layers earlier" in q or "layer earlier" in q for q, _ in rows)
    family = [line for line in tests.splitlines() if line.startswith("| add")]
    ps = [None if r.split(" | ")[4] == "-" else float(r.split(" | ")[4]) for r in family]
    assert f"corrected over the {len(family)} tests of this table" in tests
    from geolens.analysis.significance import fmt_p, holm
    assert [r.split(" | ")[5].rstrip(" |") for r in family] == [fmt_p(q) for q in holm(ps)]
    # at the 5-vs-5 floor, a family of this size leaves nothing at 0.05 (Holm multiplies the smallest p by its size)
    assert min(holm(ps)) == pytest.approx(len(family) * floor, rel=0.01)
    assert "Devices" not in tests  # one device: no device family


@pytest.mark.skipif(not (ROOT / "results" / "depth" / "records").is_dir(), reason="no committed depth records")
def test_the_committed_depth_table_is_what_the_records_give(monkeypatch):
    monkeypatch.chdir(ROOT)  # the table's notes name the records by their relative paths
    t = _table()
    onsets, tests = t.build(Path("results/depth/records"))
    assert onsets == (ROOT / "results" / "depth" / "depth_table.md").read_text()
    assert tests == (ROOT / "results" / "depth" / "depth_tests.md").read_text()
    spec = importlib.util.spec_from_file_location("embed", ROOT / "analyses" / "reproduction" / "embed_tables.py")
    embed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(embed)
    text = (ROOT / "docs" / "depth.md").read_text()
    refreshed, count = embed.embed(text)
    assert count == 2 and refreshed == text  # rerun analyses/reproduction/embed_tables.py docs/depth.md


def test_the_three_operand_z113_lane_is_refused_without_a_gpu():
    """run_cpu.sh's add3_113 lane (432,869 training inputs) runs only with DEVICE=cuda: elsewhere one line, exit 2,
    before anything trains; an unknown lane likewise."""
    import os
    import subprocess

    env = {**os.environ, "ALLOW_DIRTY": "1", "RUNS": "/nonexistent/runs"}
    for args, needle in ((["add3_113"], "run it on a GPU with DEVICE=cuda"), (["add4"], "unknown lane add4")):
        done = subprocess.run(["bash", "analyses/depth/run_cpu.sh", *args], cwd=ROOT, env={**env, "DEVICE": "cpu"},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and needle in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
