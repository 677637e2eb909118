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
  const BASE = {margin: {l: 52, r: 12, t: 10, b: 30}, height: 270, font: {size: 11},
                legend: {font: {size: 10}, orientation: "h", y: -0.3}, hovermode: "closest"};
  const state = {mode: "epoch", layer: 0, pos: 0, positions: [], playing: null};
  const color = (i) => PALETTE[i % PALETTE.length];
  const isNum = (v) => v !== null && v !== undefined && Number.isFinite(v);
  const SVG = "http://www.w3.org/2000/svg";

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
  // every panel's title is an HTML caption above its plot (the step's part changes without a plotly redraw)
  function layout(extra) { return Object.assign({}, BASE, extra || {}); }
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
  function caption(div, html) {
    const c = div.previousElementSibling;
    if (c.innerHTML !== html) c.innerHTML = html;
  }
  function extent(values) {  // [min, max] of the finite numbers in nested arrays (null: none)
    let lo = Infinity, hi = -Infinity;
    const walk = (v) => { if (Array.isArray(v)) v.forEach(walk); else if (isNum(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } };
    walk(values);
    return lo <= hi ? [lo, hi] : null;
  }
  function padded(lo, hi) {  // an axis range over [lo, hi] and 0, 5% wider
    lo = Math.min(lo, 0); hi = Math.max(hi, 0);
    const pad = 0.05 * (hi - lo || 1);
    return [lo < 0 ? lo - pad : 0, hi > 0 ? hi + pad : 0];
  }

  // ---- panels over training (every run overlaid) ---------------------------------------------------
  // a curve panel: plot() draws the curves (they stand while the step moves), step(div) places the step's marks
  // traces(data, marks): the curves into data (when given) and the step's markers into marks
  function curvePanel(id, title, yTitle, traces, logy, empty, extra) {
    return {id: id, title: title, curve: true,
      plot: () => {
        const data = [];
        traces(data, null);
        if (!data.length) return empty || null;
        return [data, layout(Object.assign({shapes: eventShapes(), xaxis: {title: {text: xTitle()}},
                                            yaxis: {title: {text: yTitle}, type: logy ? "log" : "linear"}}, extra))];
      },
      step: (div) => {
        const marks = [];
        traces(null, marks);
        placeMarks(div, marks, state.positions[state.pos]);
        caption(div, title);
      }};
  }
  function trainingTraces(cols) {  // cols: [[column, label, dash]] of the training record
    return (data, marks) => runs.forEach((r, i) => {
      const c = r.curves, x = xOf(r, c.epoch), row = marks && rowIndex(r, r.steps[stepIndex(r)]);
      cols.forEach(([col, label, dash]) => {
        if (data) data.push(line(r, i, x, c[col], label, dash));
        if (marks) marks.push(marker(r, i, x[row], c[col][row], label));
      });
    });
  }
  function scalarTraces(names) {  // names: [[scalar, label, dash]] of the analysis cache, at the checkpoints
    return (data, marks) => runs.forEach((r, i) => {
      const x = xOf(r, r.steps), k = stepIndex(r);
      names.forEach(([name, label, dash]) => {
        const y = r.scalars[name];
        if (!y) return;
        if (data) data.push(line(r, i, x, y, label, dash, {mode: "lines+markers", marker: {size: 4}}));
        if (marks) marks.push(marker(r, i, x[k], y[k], label));
      });
    });
  }
  const scaledPrecursors = new Map();
  function scaled(p) {  // a precursor column scaled to [0, 1] over its run
    if (!scaledPrecursors.has(p)) {
      const vals = p.y.filter(isNum), lo = Math.min(...vals), hi = Math.max(...vals), span = hi > lo ? hi - lo : 1;
      scaledPrecursors.set(p, p.y.map((v) => (isNum(v) ? (v - lo) / span : null)));
    }
    return scaledPrecursors.get(p);
  }
  function precursorTraces(data, marks) {  // each precursor scaled to [0, 1] over its run; hover: the value
    runs.forEach((r, i) => {
      const c = r.curves, x = xOf(r, c.epoch), row = marks && rowIndex(r, r.steps[stepIndex(r)]);
      c.precursors.forEach((p, j) => {
        const y = scaled(p), col = multi ? color(i) : PALETTE[j % PALETTE.length];
        const name = `${p.name}${isNum(p.event) ? ` (${p.rule} @ ${p.event})` : ""}`;
        if (data) data.push(line(r, i, x, y, name, ["solid", "dot", "dash", "dashdot"][Math.floor(j / 8) % 4],
                                 {customdata: p.y, hovertemplate: "%{x}: %{customdata:.4g}<extra>" + name + "</extra>",
                                  line: {color: col, width: 1.2}}));
        if (marks) marks.push(Object.assign(marker(r, i, x[row], y[row], p.name, p.y[row]), {color: col}));
      });
    });
  }
  function clockPizzaPanel() {
    const title = "Clock vs Pizza at the step";
    const traces = (data, marks, verdicts) => runs.forEach((r, i) => {
      const x = r.scalars.distance_irrelevance, y = r.scalars.grad_symmetricity;
      if (!x || !y) return;
      if (data) data.push(line(r, i, x, y, "trajectory", "solid", {mode: "lines+markers", marker: {size: 4},
                               text: r.steps.map((s) => `epoch ${s}`)}));
      if (!marks) return;
      const k = stepIndex(r);
      marks.push(marker(r, i, x[k], y[k], "at step"));
      const code = r.scalars.clock_pizza ? r.scalars.clock_pizza[k] : undefined;
      const word = code === 1 ? "clock" : code === -1 ? "pizza" : code === 0 ? "mixed" : code === null ? "unsolved" :
        `no verdict (${r.skipped.verdict || "not computed"})`;
      const circ = r.scalars.circularity ? r.scalars.circularity[k] : null;
      verdicts.push(`${multi ? r.label + ": " : ""}${word}${isNum(circ) ? `, circularity ${circ.toFixed(2)}` : ""}`);
    });
    return {id: "p-clockpizza", title: title, curve: true,
      plot: () => {
        const g = D.clock_pizza.grad_sym_pizza_min, d = D.clock_pizza.dist_irr_clock_min;
        const data = [
          {x: [0, d, d, 0, 0], y: [g, g, 1.05, 1.05, g], fill: "toself", mode: "lines", line: {width: 0},
           fillcolor: "rgba(214,39,40,0.12)", name: `pizza (sym >= ${g}, dist < ${d})`, hoverinfo: "name"},
          {x: [d, 1.05, 1.05, d, d], y: [-0.1, -0.1, g, g, -0.1], fill: "toself", mode: "lines", line: {width: 0},
           fillcolor: "rgba(31,119,180,0.12)", name: `clock (sym < ${g}, dist >= ${d})`, hoverinfo: "name"}];
        traces(data, null, null);
        if (data.length === 2) return null;
        return [data, layout({xaxis: {title: {text: "distance irrelevance"}}, yaxis: {title: {text: "gradient symmetricity"}}})];
      },
      step: (div) => {
        const marks = [], verdicts = [];
        traces(null, marks, verdicts);
        placeMarks(div, marks, null);
        caption(div, `${title}: ${verdicts.join("<br>")}`);
      }};
  }
  function landscapePanel() {
    return curvePanel("p-landscape", "LLC and sharpness", "value",
      scalarTraces([["llc", "LLC", "solid"], ["sharpness", "sharpness", "dot"]]), false,
      "not computed for this run (opt-in: geolens analyze --metrics llc,sharpness)");
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
                 {legend: {font: {size: 9}, orientation: "v", x: 1.02, y: 1}, margin: {l: 40, r: 8, t: 10, b: 40}}),
      landscapePanel(),
      clockPizzaPanel(),
    ];
  }

  // ---- panels at the step (one row per run) ------------------------------------------------------
  // plot() draws the frame once with plotly: axes spanning the run's values over every checkpoint (so heights and
  // colours compare between steps) and the colour bar; step(div) draws the step's bars, cells or points on top,
  // placed with plotly's own axis maps, with no plotly call (one costs ~15 ms of CPU). Each keeps what it drew on
  // div._step ({step, ...}); bars and cells also carry their label and value (data-x, data-y, data-value).
  //
  // the frame: these axes (no zoom: the step's layer is placed for them), no legend, no plotly hover (the layer's
  // rects carry their hover text, a canvas sets its title under the pointer); traces: by default none drawn
  function frame(axes, traces) {
    return [traces || [{x: [], y: [], type: "scatter", hoverinfo: "skip"}],
            layout({showlegend: false, hovermode: false, xaxis: Object.assign({fixedrange: true}, axes.xaxis),
                    yaxis: Object.assign({fixedrange: true}, axes.yaxis)})];
  }
  // a frame trace that only draws a colour bar (0..1) of this plotly colour scale
  const colourBar = (scale) => [{x: [null], y: [null], type: "scatter", mode: "markers", hoverinfo: "skip",
    marker: {color: [0], cmin: 0, cmax: 1, colorscale: scale, showscale: true, colorbar: {thickness: 10}}}];
  // [[r, g, b] x LEVELS] of the colour scale plotly resolved for the frame's colour bar (so cells match the bar)
  function lut(div) {
    if (!div._lut) {
      const stops = div._fullData[0].marker.colorscale.map(([t, c]) => [t, rgb(c)]);
      div._lut = Array.from({length: LEVELS}, (_, j) => {
        const t = j / (LEVELS - 1), hi = stops.findIndex((s) => s[0] >= t), b = stops[Math.max(hi, 0)], a = stops[Math.max(hi - 1, 0)];
        const w = b[0] > a[0] ? (t - a[0]) / (b[0] - a[0]) : 0;
        return a[1].map((v, c) => Math.round(v + w * (b[1][c] - v)));
      });
    }
    return div._lut;
  }
  function rgb(c) {  // "#rrggbb" or "rgb(r, g, b)" -> [r, g, b]
    if (c[0] === "#") return [1, 3, 5].map((j) => parseInt(c.slice(j, j + 2), 16));
    return c.match(/[\d.]+/g).slice(0, 3).map(Number);
  }
  const LEVELS = 4096;  // a value's colour is the scale's at the nearest level: off by at most 1/8190 of the scale
  const lutIndex = (v) => Math.max(0, Math.min(LEVELS - 1, Math.round(v * (LEVELS - 1))));
  function overlay(div, tag) {  // the plot's step layer: an svg over the whole plot, or a canvas over its plot area
    const cls = `step-layer-${tag}`;
    let el = div.querySelector(`:scope > .${cls}`);
    if (!el) {
      el = tag === "svg" ? document.createElementNS(SVG, "svg") : document.createElement(tag);
      el.setAttribute("class", cls);
      div.style.position = "relative";
      div.appendChild(el);
    }
    return el;
  }
  function items(svg, n) {  // n <rect> elements with a <title> each (the hover text), kept across steps
    while (svg.childElementCount < n) {
      const rect = svg.appendChild(document.createElementNS(SVG, "rect"));
      rect.appendChild(document.createElementNS(SVG, "title"));
    }
    while (svg.childElementCount > n) svg.lastChild.remove();
    return svg.children;
  }
  function clearStep(div, head, why) {  // nothing to draw at this step: the caption says why
    div.querySelectorAll(":scope > .step-layer-svg, :scope > .step-layer-canvas").forEach((el) => el.remove());
    div._step = {step: null, note: why};
    caption(div, `${head}: ${why}`);
  }
  // cells [{x, w (axis units, centred on x), y, h (centred on y) or y0 to y, fill, title, dx, dy, value (data-*)}]
  // as rects on the plot's axes
  function paintRects(div, cells) {
    const fl = div._fullLayout, xa = fl.xaxis, ya = fl.yaxis, svg = overlay(div, "svg");
    svg.setAttribute("width", fl.width);
    svg.setAttribute("height", fl.height);
    const els = items(svg, cells.length);
    cells.forEach((c, j) => {
      const x0 = xa._offset + xa.c2p(c.x - c.w / 2), x1 = xa._offset + xa.c2p(c.x + c.w / 2);
      const y0 = ya._offset + ya.c2p(c.y0 === undefined ? c.y - c.h / 2 : c.y0), y1 = ya._offset + ya.c2p(c.y0 === undefined ? c.y + c.h / 2 : c.y);
      const el = els[j];
      el.setAttribute("x", Math.min(x0, x1));
      el.setAttribute("width", Math.abs(x1 - x0));
      el.setAttribute("y", Math.min(y0, y1));
      el.setAttribute("height", Math.abs(y1 - y0));
      el.setAttribute("fill", c.fill);
      el.setAttribute("data-x", c.dx);
      el.setAttribute("data-y", c.dy === undefined ? "" : c.dy);
      el.setAttribute("data-value", c.value);
      el.firstChild.textContent = c.title;
    });
  }
  // bars from 0 to ys[j], 0.8 wide, at x = first + j on the axis; labels[j]: data-x
  function bars(div, first, labels, ys, fills, titles) {
    paintRects(div, ys.map((y, j) => ({x: first + j, w: 0.8, y0: 0, y: isNum(y) ? y : 0, fill: fills[j],
                                       title: titles[j], dx: labels[j], value: y})));
  }
  function placeCanvas(div, w, h) {  // the canvas over the plot area, w x h pixels of its own
    const fl = div._fullLayout, xa = fl.xaxis, ya = fl.yaxis, cv = overlay(div, "canvas");
    Object.assign(cv.style, {left: `${xa._offset}px`, top: `${ya._offset}px`, width: `${xa._length}px`, height: `${ya._length}px`});
    if (cv.width !== w) cv.width = w;
    if (cv.height !== h) cv.height = h;
    return cv;
  }

  function keysAt(r, k) { return r.pinned_keys || r.keys[k] || []; }
  function spectrumPanel(r, i, field, title) {
    const nf = () => (r[field].find((y) => y) || []).length;
    return {id: `p-${field}-${i}`, title: title,
      plot: () => {
        if (r.skipped.spectrum) return r.skipped.spectrum;
        const range = extent(r[field]);
        if (!range) return "not in the analysis cache";
        return frame({xaxis: {title: {text: "frequency k"}, range: [0.5, nf() + 0.5]}, yaxis: {range: padded(...range)}});
      },
      step: (div) => {
        const k = stepIndex(r), y = r[field][k], keys = new Set(keysAt(r, k));
        const head = `${title} @ ${r.steps[k]} (red: keys ${Array.from(keys).join(", ")})`;
        if (!y) { clearStep(div, `${title} @ ${r.steps[k]}`, "not in the analysis cache at this checkpoint"); return; }
        const x = y.map((_, j) => j + 1);
        bars(div, 1, x, y, x.map((f) => (keys.has(f) ? "#d62728" : "#9aa7b4")), y.map((v, j) => `k=${j + 1}: ${isNum(v) ? v.toPrecision(4) : "-"}`));
        div._step = {step: r.steps[k], x: x, y: y, keys: Array.from(keys)};
        caption(div, head);
      }};
  }
  function dlaPanel(r, i) {
    const title = "Direct logit attribution per component";
    const names = () => Object.keys(r.dla.find((d) => d) || {});
    return {id: `p-dla-${i}`, title: title,
      plot: () => {
        if (r.skipped.dla) return r.skipped.dla;
        const n = names(), range = extent(r.dla.map((d) => (d ? Object.values(d) : null)));
        if (!range) return "not in the analysis cache";
        return frame({xaxis: {range: [-0.5, n.length - 0.5], tickvals: n.map((_, j) => j), ticktext: n},
                      yaxis: {title: {text: "score"}, range: padded(...range)}});
      },
      step: (div) => {
        const k = stepIndex(r), d = r.dla[k];
        if (!d) { clearStep(div, `${title} @ ${r.steps[k]}`, "not in the analysis cache at this checkpoint"); return; }
        const n = names(), y = n.map((c) => d[c]);
        bars(div, 0, n, y, n.map(() => "#5a7d9a"), n.map((c, j) => `${c}: ${isNum(y[j]) ? y[j].toPrecision(4) : "-"}`));
        div._step = {step: r.steps[k], x: n, y: y};
        caption(div, `${title} @ ${r.steps[k]}`);
      }};
  }
  function attentionPanel(r, i) {
    const title = "Attention of '=' per head";
    const keysPos = ["a", "b", "="];
    return {id: `p-attn-${i}`, title: title,
      plot: () => {
        if (r.skipped.attention) return r.skipped.attention;
        return frame({xaxis: {title: {text: "key"}, range: [-0.5, 2.5], tickvals: [0, 1, 2], ticktext: keysPos},
                      yaxis: {range: [-0.5, r.n_heads - 0.5], tickvals: Array.from({length: r.n_heads}, (_, h) => h),
                              ticktext: Array.from({length: r.n_heads}, (_, h) => `H${h}`)}}, colourBar("Blues"));
      },
      step: (div) => {
        const layer = Math.min(state.layer, r.n_layers - 1), k = stepIndex(r), a = r.attention[k];
        const head = `${title}, layer ${layer} @ ${r.steps[k]}`;
        if (!a) { clearStep(div, head, "not in the analysis cache at this checkpoint"); return; }
        const colours = lut(div), cells = [];
        a[layer].forEach((row, h) => row.forEach((v, j) => cells.push({x: j, y: h, w: 1, h: 1,
          fill: isNum(v) ? `rgb(${colours[lutIndex(v)].join(",")})` : "#fff", title: `H${h} onto ${keysPos[j]}: ${isNum(v) ? v.toFixed(3) : "-"}`,
          dx: keysPos[j], dy: `H${h}`, value: v})));
        paintRects(div, cells);
        div._step = {step: r.steps[k], layer: layer, z: a[layer]};
        caption(div, head);
      }};
  }
  // every key's circle in one plot: circle j centred at x = 2.5 j, all scaled by the largest radius at the step,
  // so their sizes compare; colour: the token's position in group order
  function circlesPanel(r, i) {
    const title = "Embedding circles (share of W_E's energy)";
    const count = () => Math.max(0, ...r.circles.map((c) => (c ? c.length : 0)));  // the most keys at any step
    return {id: `p-circles-${i}`, title: title,
      plot: () => {
        if (r.skipped.circles) return r.skipped.circles;
        if (!count()) return "not computed";
        const hidden = {showticklabels: false, zeroline: false, showgrid: false};
        return frame({xaxis: Object.assign({range: [-1.2, 2.5 * (count() - 1) + 1.2]}, hidden),
                      yaxis: Object.assign({range: [-1.2, 1.2], scaleanchor: "x"}, hidden)});
      },
      step: (div) => {
        const k = stepIndex(r), circles = r.circles[k];
        if (!circles || !circles.length) { clearStep(div, `${title} @ ${r.steps[k]}`, "not computed"); return; }
        let rad = 0;
        circles.forEach((c) => c.x.forEach((x, t) => { rad = Math.max(rad, Math.hypot(x, c.y[t])); }));
        rad = rad || 1;
        const fl = div._fullLayout, xa = fl.xaxis, ya = fl.yaxis, dpr = window.devicePixelRatio || 1;
        const cv = placeCanvas(div, Math.round(xa._length * dpr), Math.round(ya._length * dpr)), ctx = cv.getContext("2d");
        ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
        ctx.clearRect(0, 0, xa._length, ya._length);
        const points = [];
        circles.forEach((c, j) => c.x.forEach((v, t) => {
          const px = xa.c2p(2.5 * j + v / rad), py = ya.c2p(c.y[t] / rad);
          ctx.fillStyle = `hsl(${(360 * t) / c.x.length},85%,45%)`;
          ctx.beginPath();
          ctx.arc(px, py, 2.5, 0, 2 * Math.PI);
          ctx.fill();
          points.push([px, py, `token ${t}, k=${c.freq}`]);
        }));
        cv._points = points;
        div._step = {step: r.steps[k], freqs: circles.map((c) => c.freq), shares: circles.map((c) => c.share), radius: rad};
        caption(div, `${title} @ ${r.steps[k]}<br>` +
                circles.map((c) => `k=${c.freq} (${isNum(c.share) ? c.share.toFixed(2) : "-"})`).join("  "));
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
  // one row per neuron (bottom: the first in order), one column per frequency, on a canvas of one pixel per cell
  function neuronsPanel(r, i) {
    const title = "Neuron energy share by frequency";
    return {id: `p-neurons-${i}`, title: title,
      plot: () => {
        if (r.skipped.neurons) return r.skipped.neurons;
        const e = (r.neurons.find((n) => n) || [])[0];
        if (!e) return "not computed";
        return frame({xaxis: {title: {text: "frequency k"}, range: [0.5, e.cols + 0.5]},
                      yaxis: {range: [-0.5, e.rows - 0.5], showticklabels: false, title: {text: "neuron (by final best k)"}}},
                     colourBar("Viridis"));
      },
      step: (div) => {
        const layer = Math.min(state.layer, r.n_layers - 1), k = stepIndex(r);
        const head = `${title}, layer ${layer} @ ${r.steps[k]}`;
        if (!r.neurons[k]) { clearStep(div, head, "not computed"); return; }
        const m = neuronMatrix(r, k, layer), order = neuronOrder(r, layer), rows = order.length, cols = m[0].length;
        const colours = lut(div), cv = placeCanvas(div, cols, rows), ctx = cv.getContext("2d");
        const img = ctx.createImageData(cols, rows);
        order.forEach((n, j) => {
          const base = (rows - 1 - j) * cols * 4;
          m[n].forEach((v, f) => { const c = colours[lutIndex(v)], o = base + 4 * f; img.data[o] = c[0]; img.data[o + 1] = c[1]; img.data[o + 2] = c[2]; img.data[o + 3] = 255; });
        });
        ctx.putImageData(img, 0, 0);
        cv._cell = (fx, fy) => {  // the hover text at a fraction of the canvas
          const f = Math.min(cols - 1, Math.floor(fx * cols)), n = order[rows - 1 - Math.min(rows - 1, Math.floor(fy * rows))];
          return `neuron #${n}, k=${f + 1}: ${m[n][f].toFixed(2)}`;
        };
        const frac = r.scalars.fve_neuron_frac ? r.scalars.fve_neuron_frac[k] : null;
        div._step = {step: r.steps[k], layer: layer, order: order, z: order.map((n) => m[n])};
        caption(div, head + (isNum(frac) && layer === r.n_layers - 1 ? ` (> 0.85: ${(100 * frac).toFixed(0)}%)` : ""));
      }};
  }
  function runPanels(r, i) {
    return [spectrumPanel(r, i, "we_spectrum", "W_E Fourier norm"), spectrumPanel(r, i, "wl_spectrum", "W_L spectrum"),
            circlesPanel(r, i), neuronsPanel(r, i), attentionPanel(r, i), dlaPanel(r, i)];
  }
  // the hover text of a canvas layer: the neuron cell under the pointer, or the nearest embedding point
  function canvasHover(ev) {
    const cv = ev.target;
    if (!cv.classList || !cv.classList.contains("step-layer-canvas")) return;
    const box = cv.getBoundingClientRect(), x = ev.clientX - box.left, y = ev.clientY - box.top;
    if (cv._cell) { cv.title = cv._cell(x / box.width, y / box.height); return; }
    let best = null, dist = 36;
    (cv._points || []).forEach((p) => { const d = (p[0] - x) ** 2 + (p[1] - y) ** 2; if (d < dist) { dist = d; best = p[2]; } });
    cv.title = best || "";
  }

  // ---- drawing ------------------------------------------------------------------------------
  let panels = [];
  // the overlay of a curve panel: the step's vertical line at stepX and one open circle per marker, placed with
  // the plot's own axes (c2p: data to pixel); each circle carries its run, series and value (data-*)
  function placeMarks(div, marks, stepX) {
    const fl = div._fullLayout, xa = fl.xaxis, ya = fl.yaxis, svg = overlay(div, "svg"), parts = [];
    svg.setAttribute("width", fl.width);
    svg.setAttribute("height", fl.height);
    if (isNum(stepX)) {
      const px = xa._offset + xa.c2p(stepX);
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
  // what a panel's plot depends on: the curves on the axis mode, the per-step frames on the layer
  const plotKey = (panel) => (panel.curve ? state.mode : `layer ${state.layer}`);
  // a panel at the current step: its plot (plotly) only when first shown or its plotKey changed, then its step
  // (marks, bars, cells, points and caption: no plotly call)
  function draw(panel) {
    const div = document.getElementById(panel.id), key = plotKey(panel);
    if (div.dataset.key === key) {
      if (!div.dataset.note) panel.step(div);
      return null;
    }
    div.dataset.key = key;
    const fig = panel.plot();
    if (fig === null || typeof fig === "string") {
      if (div.data) { Plotly.purge(div); div._hooked = false; }
      div.dataset.note = fig || "not computed for this run";
      note(div, div.dataset.note);
      caption(div, panel.title);
      return null;
    }
    if (div.dataset.note) { div.innerHTML = ""; delete div.dataset.note; }
    div._lut = null;
    return Plotly.react(div, fig[0], fig[1], CONFIG).then(() => {
      if (!div._hooked) {
        div._hooked = true;
        if (panel.curve) div.on("plotly_click", (ev) => { if (ev.points.length) jumpTo(ev.points[0].x); });
        div.on("plotly_afterplot", () => { if (div.dataset.key === plotKey(panel)) panel.step(div); });
      }
      panel.step(div);
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

    const addPanel = (parent, p) => {  // <div class=panel>: the caption (the title) above the plot's div
      const box = parent.appendChild(document.createElement("div"));
      box.className = "panel";
      box.appendChild(document.createElement("div")).className = "caption";
      const d = box.appendChild(document.createElement("div"));
      d.id = p.id;
      d.className = "plot";
      panels.push(p);
    };
    const over = document.getElementById("over-training");
    curvePanels().forEach((p) => addPanel(over, p));
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
      runPanels(r, i).forEach((p) => addPanel(grid, p));
    });
    document.addEventListener("mousemove", canvasHover);
    // for tests and benchmarks: the step control, and what a per-step panel drew at the step (div._step)
    window.geolensExplorer = {panels: panels, draw: draw, setPosition: setPosition, setMode: setMode, state: state,
                              stepIndex: (i) => stepIndex(runs[i]), drawn: (id) => document.getElementById(id)._step};
    setPosition(state.positions.length - 1);
  }
  init();
})();
