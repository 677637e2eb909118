// The geolens trajectory explorer: one step control drives every panel.
// Data: window.GEOLENS_EXPLORER (data.js, written by geolens.outputs.explorer), {title, clock_pizza, runs: [...]}
// (geolens/outputs/explorer_data.py documents a run's fields). Plotly: plotly.min.js beside this file.
(function () {
  "use strict";
  const D = window.GEOLENS_EXPLORER;
  const runs = D.runs;
  const multi = runs.length > 1;
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];
  const CONFIG = {displayModeBar: false, responsive: false, staticPlot: false};
  const BASE = {margin: {l: 52, r: 12, t: 30, b: 30}, height: 290, font: {size: 11},
                legend: {font: {size: 10}, orientation: "h", y: -0.3}, hovermode: "closest"};
  const state = {mode: "epoch", layer: 0, pos: 0, positions: [], playing: null};
  const color = (i) => PALETTE[i % PALETTE.length];
  const isNum = (v) => v !== null && v !== undefined && Number.isFinite(v);

  // ---- the step axis ---------------------------------------------------------------------------
  function offset(run) {
    return state.mode === "onset" && isNum(run.events.onset_095) ? run.events.onset_095 : 0;
  }
  function buildPositions() {
    const all = new Set();
    runs.forEach((r) => r.steps.forEach((s) => all.add(s - offset(r))));
    state.positions = Array.from(all).sort((a, b) => a - b);
  }
  function nearestIndex(values, x) {  // index of the value nearest x (ties: the earlier)
    let best = 0;
    for (let i = 1; i < values.length; i++) if (Math.abs(values[i] - x) < Math.abs(values[best] - x)) best = i;
    return best;
  }
  // the checkpoint index of run r shown at the current position
  function stepIndex(r) { return nearestIndex(r.steps, state.positions[state.pos] + offset(r)); }
  function rowIndex(r, epoch) { return nearestIndex(r.curves.epoch, epoch); }
  const xOf = (r, epochs) => epochs.map((e) => e - offset(r));
  const xTitle = () => (state.mode === "onset" ? "epoch - onset (test acc >= 0.95)" : "epoch");

  // ---- small builders --------------------------------------------------------------------------
  function layout(title, extra) { return Object.assign({}, BASE, {title: {text: title, font: {size: 12}}}, extra || {}); }
  function line(r, i, x, y, name, dash, extra) {
    return Object.assign({x: x, y: y, name: multi ? `${r.label}: ${name}` : name, type: "scatter", mode: "lines",
                          line: {color: color(i), dash: dash || "solid", width: 1.5}, meta: {run: i, series: name}}, extra || {});
  }
  // the step's point on a curve: drawn on an overlay of the plot (moving it redraws no plot); value: what it shows
  function marker(r, i, x, y, name, value) {
    return {x: x, y: y, color: color(i), run: i, series: name, value: value === undefined ? y : value};
  }
  function eventShapes() {
    const shapes = [];
    runs.forEach((r, i) => {
      [["onset_095", "dot"], ["sustained_099", "dash"]].forEach(([k, dash]) => {
        if (isNum(r.events[k])) shapes.push({type: "line", xref: "x", yref: "paper", x0: r.events[k] - offset(r),
          x1: r.events[k] - offset(r), y0: 0, y1: 1, line: {color: color(i), width: 1, dash: dash}});
      });
    });
    return shapes;
  }
  function note(div, text) { div.innerHTML = `<div class="note">${text}</div>`; }

  // ---- panels over training (every run overlaid) ---------------------------------------------------
  // traces(data, marks) fills the curves (static while the step moves) and the step's markers (shapes)
  function curvePanel(id, title, yTitle, traces, logy, empty, extra) {
    return {id: id, curve: true, render: () => {
      const data = [], marks = [];
      traces(data, marks);
      if (!data.length) return empty || null;
      return [data, layout(title, {shapes: eventShapes(), xaxis: {title: {text: xTitle()}},
                                   yaxis: {title: {text: yTitle}, type: logy ? "log" : "linear"}, ...extra}), marks,
              state.positions[state.pos]];
    }};
  }
  function trainingTraces(cols) {  // cols: [[column, label, dash]] of the training record
    return (data, marks) => runs.forEach((r, i) => {
      const c = r.curves, x = xOf(r, c.epoch), row = rowIndex(r, r.steps[stepIndex(r)]);
      cols.forEach(([col, label, dash]) => {
        data.push(line(r, i, x, c[col], label, dash));
        marks.push(marker(r, i, x[row], c[col][row], label));
      });
    });
  }
  function scalarTraces(names) {  // names: [[scalar, label, dash]] of the analysis cache, at the checkpoints
    return (data, marks) => runs.forEach((r, i) => {
      const x = xOf(r, r.steps), k = stepIndex(r);
      names.forEach(([name, label, dash]) => {
        const y = r.scalars[name];
        if (!y) return;
        data.push(line(r, i, x, y, label, dash, {mode: "lines+markers", marker: {size: 4}}));
        marks.push(marker(r, i, x[k], y[k], label));
      });
    });
  }
  function precursorTraces(data, marks) {  // each precursor scaled to [0, 1] over its run; hover: the value
    runs.forEach((r, i) => {
      const c = r.curves, x = xOf(r, c.epoch), row = rowIndex(r, r.steps[stepIndex(r)]);
      c.precursors.forEach((p, j) => {
        const vals = p.y.filter(isNum), lo = Math.min(...vals), hi = Math.max(...vals), span = hi > lo ? hi - lo : 1;
        const y = p.y.map((v) => (isNum(v) ? (v - lo) / span : null));
        const name = `${p.name}${isNum(p.event) ? ` (${p.rule} @ ${p.event})` : ""}`;
        const col = multi ? color(i) : PALETTE[j % PALETTE.length];
        data.push(line(r, i, x, y, name, ["solid", "dot", "dash", "dashdot"][Math.floor(j / 8) % 4],
                       {customdata: p.y, hovertemplate: "%{x}: %{customdata:.4g}<extra>" + name + "</extra>",
                        line: {color: col, width: 1.2}}));
        const m = marker(r, i, x[row], y[row], p.name, p.y[row]);
        m.color = col;
        marks.push(m);
      });
    });
  }
  function clockPizzaPanel() {
    return {id: "p-clockpizza", curve: true, render: () => {
      const marks = [];
      const g = D.clock_pizza.grad_sym_pizza_min, d = D.clock_pizza.dist_irr_clock_min;
      const data = [
        {x: [0, d, d, 0, 0], y: [g, g, 1.05, 1.05, g], fill: "toself", mode: "lines", line: {width: 0},
         fillcolor: "rgba(214,39,40,0.12)", name: `pizza (sym >= ${g}, dist < ${d})`, hoverinfo: "name"},
        {x: [d, 1.05, 1.05, d, d], y: [-0.1, -0.1, g, g, -0.1], fill: "toself", mode: "lines", line: {width: 0},
         fillcolor: "rgba(31,119,180,0.12)", name: `clock (sym < ${g}, dist >= ${d})`, hoverinfo: "name"}];
      const verdicts = [];
      runs.forEach((r, i) => {
        const x = r.scalars.distance_irrelevance, y = r.scalars.grad_symmetricity;
        if (!x || !y) return;
        const k = stepIndex(r);
        data.push(line(r, i, x, y, "trajectory", "solid", {mode: "lines+markers", marker: {size: 4},
                       text: r.steps.map((s) => `epoch ${s}`)}));
        marks.push(marker(r, i, x[k], y[k], "at step"));
        const code = r.scalars.clock_pizza ? r.scalars.clock_pizza[k] : undefined;
        const word = code === 1 ? "clock" : code === -1 ? "pizza" : code === 0 ? "mixed" : code === null ? "unsolved" :
          `no verdict (${r.skipped.verdict || "not computed"})`;
        const circ = r.scalars.circularity ? r.scalars.circularity[k] : null;
        verdicts.push(`${multi ? r.label + ": " : ""}${word}${isNum(circ) ? `, circularity ${circ.toFixed(2)}` : ""}`);
      });
      if (data.length === 2) return null;
      return [data, layout(`Clock vs Pizza at the step: ${verdicts.join("<br>")}`, {
        margin: {l: 52, r: 12, t: 30 + 14 * verdicts.length, b: 30}, xaxis: {title: {text: "distance irrelevance"}},
        yaxis: {title: {text: "gradient symmetricity"}}}), marks, null];
    }};
  }
  function landscapePanel() {
    return curvePanel("p-landscape", "LLC and sharpness", "value",
      scalarTraces([["llc", "LLC", "solid"], ["sharpness", "sharpness", "dot"]]), false,
      "LLC and sharpness: not computed for this run (opt-in: geolens analyze --metrics llc,sharpness)");
  }
  function curvePanels() {
    return [
      curvePanel("p-loss", "Loss (lines: onset, sustained)", "cross-entropy",
                 trainingTraces([["train_loss", "train", "dash"], ["test_loss", "test", "solid"]]), true),
      curvePanel("p-acc", "Accuracy", "accuracy",
                 trainingTraces([["train_acc", "train", "dash"], ["test_acc", "test", "solid"]]), false),
      curvePanel("p-progress", "Restricted (test) / excluded (train) loss", "cross-entropy",
                 scalarTraces([["restricted_loss", "restricted", "solid"], ["excluded_loss", "excluded", "dash"]]), true),
      curvePanel("p-fve", "FVE (paper), best key", "percent",
                 scalarTraces([["fve_paper_U_max", "U", "solid"], ["fve_paper_V_max", "V", "dash"]]), false),
      curvePanel("p-conc", "W_L Fourier concentration: top-5 share; neurons on one frequency", "fraction",
                 scalarTraces([["keyfreq_wl_fft_share", "W_L top-5 share", "solid"],
                                     ["fve_neuron_frac", "neurons > 0.85", "dash"]]), false),
      curvePanel("p-precursors", "Precursor columns (each scaled to [0, 1]; legend: event)", "scaled", precursorTraces, false, null,
                 {legend: {font: {size: 9}, orientation: "v", x: 1.02, y: 1}, margin: {l: 40, r: 8, t: 30, b: 40}}),
      landscapePanel(),
      clockPizzaPanel(),
    ];
  }

  // ---- panels at the step (one row per run) ------------------------------------------------------
  function keysAt(r, k) { return r.pinned_keys || r.keys[k] || []; }
  function spectrumPanel(r, i, field, title) {
    return {id: `p-${field}-${i}`, render: () => {
      if (r.skipped.spectrum) return r.skipped.spectrum;
      const k = stepIndex(r), y = r[field][k];
      if (!y) return "not in the analysis cache at this checkpoint";
      const keys = new Set(keysAt(r, k)), x = y.map((_, j) => j + 1);
      return [[{x: x, y: y, type: "bar", marker: {color: x.map((f) => (keys.has(f) ? "#d62728" : "#9aa7b4"))},
                name: title, meta: {run: i, series: field}}],
              layout(`${title} @ ${r.steps[k]} (red: keys ${Array.from(keys).join(", ")})`,
                     {xaxis: {title: {text: "frequency k"}}, showlegend: false})];
    }};
  }
  // every key's circle in one trace (one plot, one axis pair): circle j centred at x = 2.5 j, all scaled by the largest
  // radius at the step, so their sizes compare; colour: the token's position in group order
  function circlesPanel(r, i) {
    return {id: `p-circles-${i}`, render: () => {
      if (r.skipped.circles) return r.skipped.circles;
      const k = stepIndex(r), circles = r.circles[k];
      if (!circles || !circles.length) return "not computed";
      let rad = 0;
      circles.forEach((c) => c.x.forEach((x, t) => { rad = Math.max(rad, Math.hypot(x, c.y[t])); }));
      rad = rad || 1;
      const x = [], y = [], tok = [];
      circles.forEach((c, j) => c.x.forEach((v, t) => { x.push(2.5 * j + v / rad); y.push(c.y[t] / rad); tok.push(t); }));
      const labels = circles.map((c) => `k=${c.freq} (${isNum(c.share) ? c.share.toFixed(2) : "-"})`).join("  ");
      return [[{x: x, y: y, type: "scatter", mode: "markers", marker: {size: 4, color: tok, colorscale: "HSV"},
                meta: {run: i, freqs: circles.map((c) => c.freq), shares: circles.map((c) => c.share)},
                hovertemplate: "token %{marker.color}<extra></extra>"}],
              layout(`Embedding circles @ ${r.steps[k]} (share of W_E's energy)<br>${labels}`, {showlegend: false,
                xaxis: {range: [-1.2, 2.5 * (circles.length - 1) + 1.2], showticklabels: false, zeroline: false, showgrid: false},
                yaxis: {range: [-1.2, 1.2], showticklabels: false, zeroline: false, showgrid: false, scaleanchor: "x"}})];
    }};
  }
  const decoded = new Map();
  function neuronMatrix(r, k, layer) {  // [[share per frequency] per neuron] of checkpoint k (cached once decoded)
    const key = `${r.label}|${k}|${layer}`;
    if (!decoded.has(key)) {
      const e = r.neurons[k][layer], bytes = atob(e.b64), rows = [];
      for (let n = 0; n < e.rows; n++) {
        const row = new Array(e.cols);
        for (let f = 0; f < e.cols; f++) row[f] = bytes.charCodeAt(n * e.cols + f) / 255 * e.scale;
        rows.push(row);
      }
      decoded.set(key, rows);
    }
    return decoded.get(key);
  }
  const neuronOrders = new Map();
  function neuronOrder(r, layer) {  // neurons sorted by their best frequency at the last checkpoint, then share
    const key = `${r.label}|${layer}`;
    if (!neuronOrders.has(key)) {
      const last = neuronMatrix(r, r.steps.length - 1, layer);
      const best = last.map((row, n) => {
        let f = 0;
        row.forEach((v, j) => { if (v > row[f]) f = j; });
        return [n, f, row[f]];
      });
      best.sort((a, b) => a[1] - b[1] || b[2] - a[2]);
      neuronOrders.set(key, best.map((b) => b[0]));
    }
    return neuronOrders.get(key);
  }
  function neuronsPanel(r, i) {
    return {id: `p-neurons-${i}`, render: () => {
      if (r.skipped.neurons) return r.skipped.neurons;
      const layer = Math.min(state.layer, r.n_layers - 1), k = stepIndex(r);
      if (!r.neurons[k]) return "not computed";
      const m = neuronMatrix(r, k, layer), order = neuronOrder(r, layer);
      const frac = r.scalars.fve_neuron_frac ? r.scalars.fve_neuron_frac[k] : null;
      return [[{z: order.map((n) => m[n]), x: m[0].map((_, f) => f + 1), y: order.map((n) => `#${n}`), type: "heatmap",
                colorscale: "Viridis", zmin: 0, zmax: 1, colorbar: {thickness: 10}, meta: {run: i, layer: layer},
                hovertemplate: "neuron %{y}, k=%{x}: %{z:.2f}<extra></extra>"}],
              layout(`Neuron energy share by frequency, layer ${layer} @ ${r.steps[k]}` +
                     (isNum(frac) && layer === r.n_layers - 1 ? ` (> 0.85: ${(100 * frac).toFixed(0)}%)` : ""),
                     {xaxis: {title: {text: "frequency k"}}, yaxis: {type: "category", showticklabels: false,
                      title: {text: "neuron (by final best k)"}}})];
    }};
  }
  function attentionPanel(r, i) {
    return {id: `p-attn-${i}`, render: () => {
      if (r.skipped.attention) return r.skipped.attention;
      const layer = Math.min(state.layer, r.n_layers - 1), k = stepIndex(r), a = r.attention[k];
      if (!a) return "not in the analysis cache at this checkpoint";
      return [[{z: a[layer], x: ["a", "b", "="], y: a[layer].map((_, h) => `H${h}`), type: "heatmap", colorscale: "Blues",
                zmin: 0, zmax: 1, colorbar: {thickness: 10}, meta: {run: i, layer: layer},
                hovertemplate: "%{y} onto %{x}: %{z:.3f}<extra></extra>"}],
              layout(`Attention of '=' per head, layer ${layer} @ ${r.steps[k]}`, {xaxis: {title: {text: "key"}}})];
    }};
  }
  function dlaPanel(r, i) {
    return {id: `p-dla-${i}`, render: () => {
      if (r.skipped.dla) return r.skipped.dla;
      const k = stepIndex(r), d = r.dla[k];
      if (!d) return "not in the analysis cache at this checkpoint";
      const names = Object.keys(d);
      return [[{x: names, y: names.map((n) => d[n]), type: "bar", marker: {color: "#5a7d9a"}, meta: {run: i}}],
              layout(`Direct logit attribution per component @ ${r.steps[k]}`, {yaxis: {title: {text: "score"}}})];
    }};
  }
  function runPanels(r, i) {
    return [spectrumPanel(r, i, "we_spectrum", "W_E Fourier norm"), spectrumPanel(r, i, "wl_spectrum", "W_L spectrum"),
            circlesPanel(r, i), neuronsPanel(r, i), attentionPanel(r, i), dlaPanel(r, i)];
  }

  // ---- drawing ------------------------------------------------------------------------------
  let panels = [];
  const SVG = "http://www.w3.org/2000/svg";
  // the overlay of a curve panel: the step's vertical line and one open circle per marker, placed with the plot's
  // own axes (c2p: data to pixel); each circle carries its run, series and value (data-*)
  function placeMarks(div) {
    const marks = div._marks, fl = div._fullLayout;
    if (!marks || !fl) return;
    let svg = div.querySelector("svg.step-overlay");
    if (!svg) {
      svg = document.createElementNS(SVG, "svg");
      svg.setAttribute("class", "step-overlay");
      div.style.position = "relative";
      div.appendChild(svg);
    }
    svg.setAttribute("width", fl.width);
    svg.setAttribute("height", fl.height);
    const xa = fl.xaxis, ya = fl.yaxis, parts = [];
    if (isNum(div._stepX)) {
      const px = xa._offset + xa.c2p(div._stepX);
      parts.push(`<line x1="${px}" x2="${px}" y1="${ya._offset}" y2="${ya._offset + ya._length}" stroke="#888" stroke-width="1"/>`);
    }
    marks.forEach((m) => {
      if (!isNum(m.x) || !isNum(m.y) || (ya.type === "log" && m.y <= 0)) return;
      const px = xa._offset + xa.c2p(m.x), py = ya._offset + ya.c2p(m.y);
      parts.push(`<circle class="step-mark" cx="${px}" cy="${py}" r="6" fill="none" stroke="${m.color}" stroke-width="2.5" ` +
                 `data-run="${m.run}" data-series="${m.series}" data-x="${m.x}" data-y="${m.y}" data-value="${m.value}"/>`);
    });
    svg.innerHTML = parts.join("");
  }
  function draw(panel) {
    const div = document.getElementById(panel.id);
    const fig = panel.render();
    if (fig === null || typeof fig === "string") {
      if (div.dataset.note !== (fig || "not computed for this run")) {
        if (div.data) Plotly.purge(div);
        div.dataset.note = fig || "not computed for this run";
        note(div, div.dataset.note);
      }
      return Promise.resolve();
    }
    if (div.dataset.note) { div.innerHTML = ""; delete div.dataset.note; }
    const key = `${state.mode}|${state.layer}`;
    if (panel.curve) { div._marks = fig[2]; div._stepX = fig[3]; }
    if (panel.curve && div.data && div.dataset.key === key) {  // the curves stand: move the marks (and the title)
      placeMarks(div);
      return div.layout.title.text === fig[1].title.text ? Promise.resolve() : Plotly.relayout(div, {"title.text": fig[1].title.text});
    }
    const first = !div.data;
    div.dataset.key = key;
    return Plotly.react(div, fig[0], fig[1], CONFIG).then(() => {
      if (first && panel.curve) {
        div.on("plotly_click", (ev) => { if (ev.points.length) jumpTo(ev.points[0].x); });
        div.on("plotly_afterplot", () => placeMarks(div));
      }
      placeMarks(div);
    });
  }
  function render() {
    const x = state.positions[state.pos];
    document.getElementById("step").value = state.pos;
    document.getElementById("step-label").textContent = (state.mode === "onset" ? `onset ${x >= 0 ? "+" : ""}${x}` : `epoch ${x}`) +
      (multi ? "  (" + runs.map((r) => `${r.label}: ${r.steps[stepIndex(r)]}`).join(", ") + ")" : "") +
      `  [${state.pos + 1}/${state.positions.length}]`;
    return Promise.all(panels.map(draw)).then(() => { document.body.dataset.rendered = String(state.pos); });
  }
  let pending = null;
  function setPosition(p) {  // the one step control: every way of moving comes here
    state.pos = Math.max(0, Math.min(state.positions.length - 1, p));
    document.body.dataset.rendered = "";
    if (!pending) pending = new Promise((resolve) => requestAnimationFrame(() => { pending = null; render().then(resolve); }));
    return pending;
  }
  function jumpTo(x) { setPosition(nearestIndex(state.positions, x)); }
  function setMode(mode) {
    const x = state.positions[state.pos];
    state.mode = mode;
    buildPositions();
    document.getElementById("step").max = state.positions.length - 1;
    return setPosition(nearestIndex(state.positions, mode === "onset" ? x - offset(runs[0]) : x + (runs[0].events.onset_095 || 0)));
  }
  function togglePlay() {
    const button = document.getElementById("play");
    if (state.playing) { clearInterval(state.playing); state.playing = null; button.textContent = "play"; return; }
    if (state.pos === state.positions.length - 1) setPosition(0);
    button.textContent = "pause";
    state.playing = setInterval(() => {
      if (state.pos >= state.positions.length - 1) togglePlay(); else setPosition(state.pos + 1);
    }, 500);
  }

  function init() {
    buildPositions();
    const slider = document.getElementById("step");
    slider.max = state.positions.length - 1;
    slider.addEventListener("input", () => setPosition(Number(slider.value)));
    document.getElementById("play").addEventListener("click", togglePlay);
    document.addEventListener("keydown", (e) => {
      if (e.target.tagName === "SELECT") return;
      const moves = {ArrowRight: 1, ArrowLeft: -1, ArrowUp: 1, ArrowDown: -1};
      if (e.key in moves) { e.preventDefault(); setPosition(state.pos + moves[e.key]); }
      else if (e.key === "Home") setPosition(0);
      else if (e.key === "End") setPosition(state.positions.length - 1);
      else if (e.key === " ") { e.preventDefault(); togglePlay(); }
    });
    const maxLayers = Math.max(...runs.map((r) => r.n_layers));
    const layerSel = document.getElementById("layer");
    if (maxLayers > 1) {
      for (let l = 0; l < maxLayers; l++) layerSel.add(new Option(`layer ${l}`, String(l)));
      layerSel.value = String(maxLayers - 1);
      state.layer = maxLayers - 1;
      layerSel.addEventListener("change", () => { state.layer = Number(layerSel.value); setPosition(state.pos); });
    } else document.getElementById("layer-box").hidden = true;
    const modeSel = document.getElementById("mode");
    if (multi) modeSel.addEventListener("change", () => setMode(modeSel.value));
    else document.getElementById("mode-box").hidden = true;

    const over = document.getElementById("over-training");
    panels = curvePanels();
    panels.forEach((p) => { const d = document.createElement("div"); d.id = p.id; d.className = "panel"; over.appendChild(d); });
    const at = document.getElementById("at-step");
    runs.forEach((r, i) => {
      const h = document.createElement("h3");
      h.textContent = `${r.label} (${r.group}${r.keys_words ? "; key metrics: " + r.keys_words : ""})`;
      h.style.color = color(i);
      at.appendChild(h);
      const skipped = Object.entries(r.skipped);
      if (skipped.length) {
        const p = document.createElement("p");
        p.className = "note";
        p.textContent = "Not shown for this run: " + skipped.map(([k, v]) => `${k} (${v})`).join("; ");
        at.appendChild(p);
      }
      const grid = document.createElement("div");
      grid.className = "grid";
      at.appendChild(grid);
      runPanels(r, i).forEach((p) => {
        const d = document.createElement("div"); d.id = p.id; d.className = "panel"; grid.appendChild(d); panels.push(p);
      });
    });
    window.geolensExplorer = {panels: panels, draw: draw, setPosition: setPosition, setMode: setMode, state: state, stepIndex: (i) => stepIndex(runs[i]),
                              timedMove: (p) => { const t0 = performance.now(); return setPosition(p).then(() => performance.now() - t0); }};
    setPosition(state.positions.length - 1);
  }
  init();
})();
