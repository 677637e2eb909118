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

    def drawn(self, panel: str) -> dict:
        """What a per-step panel drew at the step: its record (step: what the page drew, geolensExplorer.drawn), its
        caption, its rects (bars, cells) with their data-* and whether each sits where plotly's axes put its label
        (bars: from 0 to the value; cells: one unit around their labels, coloured as the colour bar says), whether its
        canvas spans the plot area, and the canvas's pixel rows (bottom first) where it is one pixel per cell."""
        return self.page.evaluate("""(id) => {
            const div = document.getElementById(id), xa = div._fullLayout.xaxis, ya = div._fullLayout.yaxis;
            const at = (ax, label) => ax._offset + ax.c2p(ax.ticktext && ax.ticktext.includes(label) ?
                                                          ax.tickvals[ax.ticktext.indexOf(label)] : Number(label));
            const near = (a, b) => Math.abs(a - b) < 0.5;
            const rgb = (c) => c[0] === "#" ? [1, 3, 5].map((j) => parseInt(c.slice(j, j + 2), 16)) : c.match(/[0-9.]+/g).slice(0, 3).map(Number);
            const colour = (v) => {  // the colour bar's colour at v (its scale: plotly's, linear between stops)
                const s = div._fullData[0].marker.colorscale, j = Math.max(1, s.findIndex((t) => t[0] >= v));
                const [a, b] = [s[j - 1], s[j]], w = (v - a[0]) / (b[0] - a[0]);
                return rgb(a[1]).map((x, c) => x + w * (rgb(b[1])[c] - x));
            };
            const sameColour = (a, b) => a.every((x, c) => Math.abs(x - b[c]) <= 1.5);
            const rects = Array.from(div.querySelectorAll("svg.step-layer-svg rect")).map((el) => {
                const [x, w, y, h] = ["x", "width", "y", "height"].map((a) => Number(el.getAttribute(a)));
                const d = el.dataset, value = Number(d.value);
                const vertical = d.y === "" ? near(Math.min(at(ya, 0), at(ya, value)), y) && near(Math.abs(at(ya, 0) - at(ya, value)), h)
                                            : near(y + h / 2, at(ya, d.y)) && near(h, Math.abs(ya.c2p(1) - ya.c2p(0)));
                const coloured = d.y === "" || sameColour(rgb(el.getAttribute("fill")), colour(value));
                return {x: d.x, y: d.y, value: value, placed: near(x + w / 2, at(xa, d.x)) && vertical, coloured: coloured};
            });
            const cv = div.querySelector("canvas.step-layer-canvas"), box = cv && cv.getBoundingClientRect(), plot = div.getBoundingClientRect();
            const step = geolensExplorer.drawn(id);
            let pixels = null;  // [row from the bottom][column]: whether the pixel has the colour bar's colour of the value
            if (cv && step.z) {
                const px = cv.getContext("2d").getImageData(0, 0, cv.width, cv.height).data;
                pixels = step.z.map((row, j) => row.map((v, f) => sameColour(Array.from(px.slice(
                    4 * ((cv.height - 1 - j) * cv.width + f), 4 * ((cv.height - 1 - j) * cv.width + f) + 3)), colour(v))));
            }
            return {step: step, caption: div.previousElementSibling.textContent, rects: rects, pixels: pixels,
                    canvas: cv ? {width: cv.width, height: cv.height, placed: near(box.left - plot.left, xa._offset) &&
                                  near(box.top - plot.top, ya._offset) && near(box.width, xa._length) && near(box.height, ya._length)} : null};
        }""", panel)

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

        spectrum = page.drawn(f"p-wl_spectrum-{i}")
        want = [v["wl_spectrum"][f"wl_spectrum_{f}"] for f in range(1, len(v["wl_spectrum"]) + 1)]
        assert spectrum["step"]["y"] == pytest.approx(want) and spectrum["step"]["step"] == step
        assert [r["value"] for r in spectrum["rects"]] == pytest.approx(want)
        assert [int(r["x"]) for r in spectrum["rects"]] == list(range(1, len(want) + 1))
        assert all(r["placed"] for r in spectrum["rects"])
        assert f"@ {step}" in spectrum["caption"]
        assert sorted(spectrum["step"]["keys"]) == sorted(traj.keys)
        dla = page.drawn(f"p-dla-{i}")["rects"]
        assert {r["x"]: r["value"] for r in dla} == pytest.approx({k[4:]: x for k, x in v["dla"].items() if k[4:] in [r["x"] for r in dla]})
        assert len(dla) >= traj.run.config.n_heads + 2 and all(r["placed"] for r in dla)
        own = min(layer, traj.run.config.n_layers - 1)
        attn = page.drawn(f"p-attn-{i}")
        assert attn["step"]["layer"] == own and f"layer {own} @ {step}" in attn["caption"]
        assert {(r["y"], r["x"]): r["value"] for r in attn["rects"]} == pytest.approx(
            {(f"H{h}", key): v["attn_eq"][f"attn_eq_{p}_L{own}H{h}"]
             for h in range(traj.run.config.n_heads) for p, key in (("a", "a"), ("b", "b"), ("eq", "="))})
        assert all(r["placed"] and r["coloured"] for r in attn["rects"])
        circles = page.drawn(f"p-circles-{i}")
        assert circles["step"]["freqs"] == traj.keys and circles["canvas"]["placed"]
        assert circles["step"]["shares"] == pytest.approx([v["embed_circles"][f"embed_circle_share_{r + 1}"]
                                                           for r in range(len(traj.keys))], rel=1e-5)
        heat = page.drawn(f"p-neurons-{i}")
        ctx = AnalysisContext(traj.run.model_at(step), traj.run.config_at(step), traj.run.dataset)
        shares = neuron_freq_shares(ctx.frame.grid(ctx.eq[f"blocks.{own}.mlp.hook_post"]))[0]
        assert heat["step"]["layer"] == own and heat["step"]["step"] == step
        assert heat["canvas"] == {"width": shares.shape[1], "height": shares.shape[0], "placed": True}
        assert sorted(heat["step"]["order"]) == list(range(traj.run.config.d_mlp))
        assert all(all(row) for row in heat["pixels"])  # every cell drawn in its value's colour, in the order
        scale = float(shares.max())
        for n, z in zip(heat["step"]["order"], heat["step"]["z"]):
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
    page.page.evaluate("""() => { window.plotlyCalls = 0;  // a move draws on plotly's axes and calls no plotly
        for (const f of ["react", "newPlot", "restyle", "relayout", "update", "animate"]) {
            const orig = Plotly[f]; Plotly[f] = (...a) => { window.plotlyCalls++; return orig(...a); }; } }""")
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
    assert page.errors == [] and page.page.evaluate("window.plotlyCalls") == 0


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
