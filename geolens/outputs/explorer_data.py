"""The data of the trajectory explorer: one run's numbers, as the page embeds them (a JSON-ready dict).

Everything over training comes from what geolens already recorded: the training record (run.metrics: losses,
accuracies, the precursor columns, events.json) and the analysis cache (Trajectory.values: the registry's
metrics at every checkpoint). The per-step matrices the cache does not hold are computed here by geolens's own
analysis functions, one AnalysisContext per checkpoint (the keys the trajectory pinned):
    W_E's Fourier norm per frequency          keyfreq.embed_freq_norms(W_E in group order)
    the embedding circles of the key freqs    circuit.embedding_circles
    each neuron's energy share by frequency   keyfreq.neuron_freq_shares of every layer's MLP at `=` (uint8 with a
                                              per-matrix scale, base64: [d_mlp, n // 2] row-major)
"""

from __future__ import annotations

import base64
import math

import torch

from geolens.analysis.registry import skip_reason
from geolens.analysis.trajectory import Trajectory, keys_words, ranked_keys

#: the panels whose metric, when skipped for a config, hides the panel behind its reason
PANEL_METRICS = {"spectrum": "wl_spectrum", "circles": "embed_circles", "neurons": "keyfreq_neuron",
                 "progress": "restricted_loss", "clock_pizza": "distance_irrelevance", "attention": "attn_eq",
                 "dla": "dla", "verdict": "clock_pizza"}
DLA_EXTRA = ("dla_total", "dla_recon_err", "dla_normalised_space", "dla_neuron_top10_share")
CURVE_COLUMNS = ("train_loss", "test_loss", "train_acc", "test_acc")


def _num(v: float | None) -> float | None:
    """A float for JSON (NaN and infinities become null)."""
    return None if v is None or not math.isfinite(v) else float(v)


def _short(v: float) -> float:
    """A float of a drawn coordinate, to 4 significant digits (the page's size; never a metric value)."""
    return float(f"{v:.4g}")


def encode_shares(shares: torch.Tensor) -> dict:
    """[rows, cols] values >= 0 as uint8 with one scale: value ~ byte / 255 * scale (error <= scale / 510)."""
    scale = float(shares.max()) if shares.numel() else 0.0
    q = torch.zeros_like(shares) if scale <= 0 else (shares / scale * 255).round()
    data = q.to(torch.uint8).contiguous().numpy().tobytes()
    return {"scale": scale, "rows": shares.shape[0], "cols": shares.shape[1], "b64": base64.b64encode(data).decode()}


def _series(traj: Trajectory, metric: str, name: str) -> list[float | None]:
    """One cached scalar at every checkpoint of the trajectory (None where it was not computed)."""
    return [_num(traj.values[s].get(metric, {}).get(name)) for s in traj.steps]


def _curves(run) -> dict:
    """The training record: epochs and the loss/accuracy columns, and every recorded precursor with its event."""
    from geolens.analysis.precursors import recorded, run_events
    from geolens.runs.precursor_events import PRECURSORS

    rows = run.metrics
    out = {"epoch": [int(r["epoch"]) for r in rows]}
    out.update({c: [_num(r.get(c)) for r in rows] for c in CURVE_COLUMNS})
    events = run_events(run, rows)
    out["precursors"] = [{"name": p.name, "rule": p.rule, "event": events[p.name], "y": [_num(p.value(r)) for r in rows]}
                         for p in PRECURSORS if p.name not in ("llc", "test_loss") and recorded(p, rows)]
    return out


def _scalars(traj: Trajectory) -> dict[str, list[float | None]]:
    """The cached metrics the panels draw, by scalar name, one value per checkpoint."""
    cfg = traj.run.config
    pick = {
        "loss": ["loss_train", "loss_test", "acc_train", "acc_test"],
        "restricted_loss": ["restricted_loss"], "excluded_loss": ["excluded_loss"],
        "fve_paper": ["fve_paper_U_max", "fve_paper_V_max"], "keyfreq_wl_fft": ["keyfreq_wl_fft_share"],
        "fve_neuron": ["fve_neuron_frac"], "grad_symmetricity": ["grad_symmetricity"],
        "distance_irrelevance": ["distance_irrelevance"], "clock_pizza": ["clock_pizza"],
        "circularity": ["circularity"], "llc": ["llc", "llc_std"], "sharpness": ["sharpness"],
        "layer_distance_irrelevance": [f"distance_irrelevance_L{l}" for l in range(cfg.n_layers)],
    }
    return {name: _series(traj, metric, name) for metric, names in pick.items() for name in names
            if any(name in traj.values[s].get(metric, {}) for s in traj.steps)}


def _per_step_cached(traj: Trajectory) -> dict:
    """Per checkpoint, from the cache: the W_L spectrum and its keys, the DLA per component, the attention of `=`."""
    cfg = traj.run.config
    spectrum, keys, dla, attn = [], [], [], []
    for s in traj.steps:
        v = traj.values[s]
        spec = v.get("wl_spectrum")
        spectrum.append(None if spec is None else [_num(spec[f"wl_spectrum_{k}"]) for k in range(1, len(spec) + 1)])
        keys.append(ranked_keys(v["keyfreq_wl_fft"]) if "keyfreq_wl_fft" in v else None)
        d = v.get("dla")
        dla.append(None if d is None else {k[4:]: _num(x) for k, x in d.items() if k not in DLA_EXTRA})
        a = v.get("attn_eq")
        attn.append(None if a is None else [[[_num(a.get(f"attn_eq_{pos}_L{l}H{h}")) for pos in ("a", "b", "eq")]
                                             for h in range(cfg.n_heads)] for l in range(cfg.n_layers)])
    return {"wl_spectrum": spectrum, "keys": keys, "dla": dla, "attention": attn}


def _per_step_computed(traj: Trajectory) -> dict:
    """Per checkpoint, computed by the analysis functions: W_E's spectrum, the key circles, the neuron shares."""
    from geolens.analysis import AnalysisContext
    from geolens.analysis.circuit import embedding_circles
    from geolens.analysis.keyfreq import embed_freq_norms, neuron_freq_shares
    from geolens.threads import torch_threads

    run, cfg = traj.run, traj.run.config
    out = {"we_spectrum": [], "circles": [], "neurons": []}
    if skip_reason("keyfreq_embed", cfg) is not None:
        return out
    neurons = skip_reason("keyfreq_neuron", cfg) is None
    with torch_threads(1), torch.no_grad():
        for step in traj.steps:
            ctx = AnalysisContext(run.model_at(step), run.config_at(step), run.dataset, key_freqs=traj.keys)
            out["we_spectrum"].append([_num(x) for x in embed_freq_norms(ctx.W_E_group).tolist()])
            out["circles"].append([{"freq": c.freq, "share": _num(c.share), "x": [_short(x) for x in c.coords[:, 0].tolist()],
                                    "y": [_short(y) for y in c.coords[:, 1].tolist()]}
                                   for c in embedding_circles(ctx.W_E_group, ctx.key_freqs)])
            if neurons:
                out["neurons"].append([encode_shares(neuron_freq_shares(ctx.frame.grid(ctx.eq[f"blocks.{l}.mlp.hook_post"]))[0])
                                       for l in range(cfg.n_layers)])
    return out


def run_payload(traj: Trajectory, label: str) -> dict:
    """Everything the explorer draws of one run (see the module docstring), JSON-ready."""
    run, cfg = traj.run, traj.run.config
    skipped = {panel: skip_reason(metric, cfg) for panel, metric in PANEL_METRICS.items()}
    events = run.events
    cyclic = skip_reason("keyfreq_wl_fft", cfg) is None
    return {
        "label": label,
        "path": str(run.path),
        "summary": {k: (v if isinstance(v, (int, float)) and math.isfinite(v) else str(v))
                    for k, v in run.summary().items() if v is not None},
        "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
        "group": (f"S_{cfg.n_perm}" if cfg.task == "perm" else f"Z_{cfg.p}"),
        "keys_words": keys_words(traj) if cyclic else None,
        "pinned_keys": traj.keys,
        "events": {k: events.get(k) for k in ("onset_095", "sustained_099")},
        "steps": traj.steps,
        "skipped": {k: v for k, v in skipped.items() if v is not None},
        "curves": _curves(run),
        "scalars": _scalars(traj),
        **_per_step_cached(traj),
        **_per_step_computed(traj),
    }
