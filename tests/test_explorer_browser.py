"""The trajectory explorer in a real browser: headless Chromium (Debian's `chromium`, driven by playwright) opens
the page from file://, with no console error and no network request; moving the step (slider, arrow keys, a click
on a curve, the layer and the onset-relative axis) redraws the panels at geolens's own metric values there."""

import shutil
from pathlib import Path

import pytest

from geolens.analysis import AnalysisContext
from geolens.analysis.keyfreq import neuron_freq_shares
from geolens.analysis.shipped import reference_path
from geolens.analysis.trajectory import analyze_run
from geolens.model.config import make_config
from geolens.outputs.explorer import write_explorer
from geolens.runs.run import load_run
from geolens.training import train as training

CHROMIUM = shutil.which("chromium")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    sync_playwright = None
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install -y chromium; README: Testing)"),
    pytest.mark.skipif(sync_playwright is None, reason="playwright not installed (pip install -e '.[dev]')"),
]

SMALL = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.6, lr=3e-3)
TIMEOUT_MS = 120_000  # the page's first draw on a loaded 2-core machine


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def trajs(tmp_path_factory):
    """A one-layer and a two-layer run (p = 23, 4 checkpoints each), analysed."""
    root = tmp_path_factory.mktemp("browser")
    out = []
    for name, layers in (("one", 1), ("two", 2)):
        cfg = make_config("fb", epochs=120, eval_every=10, checkpoints="every:40", seed=1, n_layers=layers, **SMALL)
        training.train(cfg, root / name, progress=False)
        out.append(analyze_run(load_run(root / name), progress=False))
    return out


class Page:
    """One explorer page open in Chromium, with its console errors and requests recorded."""

    def __init__(self, browser, folder: Path):
        self.errors, self.requests = [], []
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto((folder / "index.html").as_uri())
        self.wait(None)

    def wait(self, pos: int | None) -> None:
        want = "document.body.dataset.rendered" + (f" === '{pos}'" if pos is not None else "")
        self.page.wait_for_function(want, timeout=TIMEOUT_MS)

    def pos(self) -> int:
        return int(self.page.evaluate("document.body.dataset.rendered"))

    def shown(self, run: int) -> int:
        """The checkpoint index the page shows for run number `run`."""
        return self.page.evaluate(f"geolensExplorer.stepIndex({run})")

    def marks(self, panel: str) -> list[dict]:
        """The step's circles on a curve panel: their data values and whether each sits at its plotly pixel."""
        return self.page.evaluate("""(id) => {
            const div = document.getElementById(id), xa = div._fullLayout.xaxis, ya = div._fullLayout.yaxis;
            return Array.from(div.querySelectorAll("circle.step-mark")).map((c) => ({
                run: Number(c.dataset.run), series: c.dataset.series, x: Number(c.dataset.x), y: Number(c.dataset.y),
                value: Number(c.dataset.value),
                placed: Math.abs(Number(c.getAttribute("cx")) - xa._offset - xa.c2p(Number(c.dataset.x))) < 0.5 &&
                        Math.abs(Number(c.getAttribute("cy")) - ya._offset - ya.c2p(Number(c.dataset.y))) < 0.5}));
        }""", panel)

    def plot(self, panel: str) -> dict:
        """A plotly panel's data (its traces) and title."""
        return self.page.evaluate("""(id) => { const div = document.getElementById(id);
            return {data: JSON.parse(JSON.stringify(div.data)), title: div.layout.title.text}; }""", panel)

    def close(self) -> None:
        self.page.close()


def mark(marks: list[dict], run: int, series: str) -> dict:
    found = [m for m in marks if m["run"] == run and m["series"] == series]
    assert len(found) == 1, (run, series, marks)
    assert found[0]["placed"]
    return found[0]


def check_views(page: Page, trajs, layer: int, onsets: list[int] | None = None) -> None:
    """Every panel shows each run's values at the checkpoint the page says it shows (onsets: the slider is by epoch
    relative to these)."""
    for i, traj in enumerate(trajs):
        k = page.shown(i)
        step = traj.steps[k]
        v = traj.values[step]
        row = next(r for r in traj.run.metrics if r["epoch"] == step)
        assert mark(page.marks("p-loss"), i, "test")["y"] == pytest.approx(row["test_loss"], rel=1e-12)
        assert mark(page.marks("p-acc"), i, "train")["y"] == pytest.approx(row["train_acc"], rel=1e-12)
        assert mark(page.marks("p-loss"), i, "test")["x"] == step - (onsets[i] if onsets else 0)
        assert mark(page.marks("p-progress"), i, "restricted")["y"] == pytest.approx(v["restricted_loss"]["restricted_loss"])
        assert mark(page.marks("p-fve"), i, "U")["y"] == pytest.approx(v["fve_paper"]["fve_paper_U_max"])
        assert mark(page.marks("p-conc"), i, "W_L top-5 share")["y"] == pytest.approx(v["keyfreq_wl_fft"]["keyfreq_wl_fft_share"])
        cp = mark(page.marks("p-clockpizza"), i, "at step")
        assert (cp["x"], cp["y"]) == pytest.approx((v["distance_irrelevance"]["distance_irrelevance"],
                                                   v["grad_symmetricity"]["grad_symmetricity"]))
        wn = mark(page.marks("p-precursors"), i, "weight_norm")
        assert wn["value"] == pytest.approx(row["weight_norm"])

        spectrum = page.plot(f"p-wl_spectrum-{i}")
        assert spectrum["data"][0]["y"] == pytest.approx([v["wl_spectrum"][f"wl_spectrum_{f}"]
                                                          for f in range(1, len(v["wl_spectrum"]) + 1)])
        assert f"@ {step}" in spectrum["title"]
        red = [f for f, c in zip(spectrum["data"][0]["x"], spectrum["data"][0]["marker"]["color"]) if c == "#d62728"]
        assert sorted(red) == sorted(traj.keys)
        dla = page.plot(f"p-dla-{i}")["data"][0]
        assert dict(zip(dla["x"], dla["y"])) == pytest.approx({k[4:]: x for k, x in v["dla"].items() if k[4:] in dla["x"]})
        own = min(layer, traj.run.config.n_layers - 1)
        attn = page.plot(f"p-attn-{i}")["data"][0]
        assert [z for row in attn["z"] for z in row] == pytest.approx(
            [v["attn_eq"][f"attn_eq_{p}_L{own}H{h}"] for h in range(traj.run.config.n_heads) for p in ("a", "b", "eq")])
        circles = page.plot(f"p-circles-{i}")["data"][0]["meta"]
        assert circles["freqs"] == traj.keys
        assert circles["shares"] == pytest.approx([v["embed_circles"][f"embed_circle_share_{r + 1}"]
                                                   for r in range(len(traj.keys))], rel=1e-5)
        heat = page.plot(f"p-neurons-{i}")["data"][0]
        ctx = AnalysisContext(traj.run.model_at(step), traj.run.config_at(step), traj.run.dataset)
        shares = neuron_freq_shares(ctx.frame.grid(ctx.eq[f"blocks.{own}.mlp.hook_post"]))[0]
        drawn = {int(name[1:]): z for name, z in zip(heat["y"], heat["z"])}
        assert sorted(drawn) == list(range(traj.run.config.d_mlp))
        scale = float(shares.max())
        for n, z in drawn.items():
            assert z == pytest.approx(shares[n].tolist(), abs=scale / 510 + 1e-6)


@pytest.fixture(scope="module")
def page(browser, trajs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("page") / "explorer"
    write_explorer(trajs, folder)
    p = Page(browser, folder)
    yield p
    p.close()


def test_opens_from_file_with_no_error_and_no_network(page):
    assert page.errors == []
    assert page.requests and all(u.startswith("file://") for u in page.requests)
    assert page.pos() == len(page.page.evaluate("geolensExplorer.state.positions")) - 1  # opens at the last step


def test_slider_redraws_every_panel_at_the_step(page, trajs):
    page.page.fill("#step", "1")
    page.wait(1)
    assert [page.shown(i) for i in range(2)] == [1, 1]
    check_views(page, trajs, layer=1)
    page.page.keyboard.press("ArrowLeft")
    page.wait(0)
    check_views(page, trajs, layer=1)
    page.page.keyboard.press("End")
    page.wait(3)
    check_views(page, trajs, layer=1)
    assert page.errors == []


def test_layer_selector_switches_the_layer_views(page, trajs):
    pos = page.pos()
    page.page.select_option("#layer", "0")
    page.wait(pos)
    check_views(page, trajs, layer=0)
    page.page.select_option("#layer", "1")
    page.wait(pos)
    check_views(page, trajs, layer=1)


def test_a_click_on_a_curve_jumps_to_that_step(page, trajs):
    page.page.fill("#step", "3")
    page.wait(3)
    epoch = trajs[0].steps[1]
    x, y = page.page.evaluate("""(epoch) => {
        const div = document.getElementById("p-progress"), fl = div._fullLayout, box = div.getBoundingClientRect();
        const trace = div.data.find((t) => t.meta && t.meta.run === 0 && t.meta.series === "restricted");
        const k = trace.x.indexOf(epoch);
        return [box.left + fl.xaxis._offset + fl.xaxis.c2p(epoch), box.top + fl.yaxis._offset + fl.yaxis.c2p(trace.y[k])];
    }""", epoch)
    page.page.mouse.move(x, y)
    page.page.mouse.click(x, y)
    page.wait(1)
    assert page.shown(0) == 1
    check_views(page, trajs, layer=1)


def test_shipped_runs_side_by_side_relative_to_their_onsets(browser, tmp_path):
    """The two shipped trajectories (LayerNorm and fully bounded) on one page, the slider by epoch - onset."""
    trajs = []
    for name in ("fb", "ln"):
        shutil.copytree(reference_path(name), tmp_path / name)  # analyze_run writes its table: not into the repository
        trajs.append(analyze_run(load_run(tmp_path / name), progress=False))
    assert all(t.computed == 0 for t in trajs)  # the shipped cache holds every metric
    write_explorer(trajs, tmp_path / "page")
    page = Page(browser, tmp_path / "page")
    page.page.select_option("#mode", "onset")
    page.wait(None)
    onsets = [t.run.events["onset_095"] for t in trajs]
    positions = page.page.evaluate("geolensExplorer.state.positions")
    assert positions == sorted({s - o for t, o in zip(trajs, onsets) for s in t.steps})
    zero = min(range(len(positions)), key=lambda j: abs(positions[j]))
    page.page.fill("#step", str(zero))
    page.wait(zero)
    for i, (t, onset) in enumerate(zip(trajs, onsets)):  # each run at its checkpoint nearest its own onset
        k = page.shown(i)
        assert t.steps[k] == min(t.steps, key=lambda s: (abs(s - onset), s))
        loss = mark(page.marks("p-loss"), i, "test")
        assert loss["x"] == t.steps[k] - onset
    check_views(page, trajs, layer=0, onsets=onsets)
    assert page.errors == [] and all(u.startswith("file://") for u in page.requests)
    page.close()


def test_analyzes_report_and_explorer_load_one_shared_plotly_from_file(browser, trajs, tmp_path, geolens):
    """`geolens analyze` writes plotly.js once: report.html loads plotly.min.js beside it, the explorer
    ../plotly.min.js; both draw from file:// with no error and no network request."""
    r = geolens("analyze", "--run", trajs[0].run.path, "--out", tmp_path / "a", "--static", "", "--quiet")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "a" / "explorer" / "plotly.min.js").exists()
    page = Page(browser, tmp_path / "a" / "explorer")
    assert page.errors == [] and all(u.startswith("file://") for u in page.requests)
    assert any(u.endswith("/a/plotly.min.js") for u in page.requests)
    page.close()
    report, errors, requests = browser.new_page(), [], []
    report.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    report.on("pageerror", lambda e: errors.append(str(e)))
    report.on("request", lambda q: requests.append(q.url))
    report.goto((tmp_path / "a" / "report.html").as_uri())
    report.wait_for_function("document.querySelectorAll('.plotly-graph-div .main-svg').length >= 5", timeout=TIMEOUT_MS)
    assert errors == [] and all(u.startswith("file://") for u in requests)
    report.close()
