"""Probe the circuit at one training step: key frequencies, FVE, Clock/Pizza verdict, top heads and
neurons by direct logit attribution. Used by `geolens probe` and `geolens.load_run(...).probe`.

One forward over every input serves it all: the checkpoint's AnalysisContext (its activations at
`=` give the metrics and the attribution). The full ActivationCache (every hook, every position,
for TransformerLens tooling) is one run_with_cache more, made on first access of Probe.cache.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from geolens.errors import GeoError
from geolens.model.cache import GeoActivationCache
from geolens.model.transformer import GeoTransformer

if TYPE_CHECKING:
    from geolens.analysis import AnalysisContext
    from geolens.analysis.circuit import DLAResult


@dataclass(repr=False)
class Probe:
    """The circuit at `step` (the checkpoint nearest the `requested` epoch).

    context: the checkpoint's analysis.AnalysisContext (model, dataset, activations at `=`);
    metrics / skipped: compute_metrics output on it; dla: circuit.DLAResult over every input;
    cache (computed on first access): GeoActivationCache of the model over every input of the
    task (a-major order).
    """

    requested: int
    step: int
    model: GeoTransformer
    context: AnalysisContext
    metrics: dict[str, dict[str, float]]
    skipped: dict[str, str]
    dla: DLAResult

    @functools.cached_property
    def cache(self) -> GeoActivationCache:
        """run_with_cache of the model over every input (made once, on first access)."""
        with torch.no_grad():
            _, cache = self.model.run_with_cache(self.context.dataset.tokens)
        return cache

    def __repr__(self) -> str:
        loss = self.metrics.get("loss", {})
        asked = "" if self.step == self.requested else f" (requested {self.requested})"
        heads = ", ".join(f"{n} {v:+.3f}" for n, v in self.top_heads())
        return (f"Probe(epoch {self.step}{asked}: acc train {loss.get('acc_train', float('nan')):.4f} "
                f"test {loss.get('acc_test', float('nan')):.4f}, key_freqs {self.key_freqs}, verdict {self.verdict!r}, "
                f"top heads by DLA {heads})")

    def _ranked(self, family: str, prefix: str) -> list[float]:
        """Values of the metric columns prefix_1, prefix_2, ... of `family`, in rank order."""
        vals = self.metrics.get(family, {})
        ranks = sorted(int(k[len(prefix) + 1:]) for k in vals if k.startswith(prefix + "_") and k[len(prefix) + 1:].isdigit())
        return [vals[f"{prefix}_{r}"] for r in ranks]

    @property
    def key_freqs(self) -> list[int]:
        """Key frequencies by the paper's W_L FFT rule (keyfreq_wl_fft), strongest first."""
        return [int(v) for v in self._ranked("keyfreq_wl_fft", "keyfreq_wl_fft") if v == v]

    @property
    def fve(self) -> dict[int, tuple[float, float]]:
        """{key frequency: (FVE of U, FVE of V)} in percent (fve_paper), strongest key first."""
        U = self._ranked("fve_paper", "fve_paper_U")
        V = self._ranked("fve_paper", "fve_paper_V")
        return {k: (float(U[r]), float(V[r])) for r, k in enumerate(self.key_freqs) if r < len(U) and r < len(V)}

    @property
    def verdict(self) -> str:
        """Clock / Pizza verdict ('clock', 'pizza', 'mixed', 'unsolved'), or 'n/a (why)'."""
        from geolens.analysis.clockpizza import VERDICT_CODES

        code = self.metrics.get("clock_pizza", {}).get("clock_pizza")
        if code is None:
            return f"n/a ({self.skipped.get('clock_pizza', 'not computed')})"
        return next(name for name, c in VERDICT_CODES.items() if c == code or (c != c and code != code))

    def layer_rows(self) -> list[tuple[int, list[int], float | None, float | None, float]]:
        """Per layer of a model of two or more layers ([] for one layer): (layer, its MLP's direct-path key
        frequencies, strongest first, and their share of its energy (layer_spectrum), the distance irrelevance of
        its direct contribution (layer_distance_irrelevance; None where not computed), the mean DLA of its MLP)."""
        if self.model.cfg.n_layers < 2:
            return []
        spectrum = self.metrics.get("layer_spectrum", {})
        irrelevance = self.metrics.get("layer_distance_irrelevance", {})
        means = self.dla.means()
        rows = []
        for l in range(self.model.cfg.n_layers):
            keys = [int(v) for r in range(1, 6) if (v := spectrum.get(f"layer_spectrum_L{l}_key_{r}")) is not None and v == v]
            rows.append((l, keys, spectrum.get(f"layer_spectrum_L{l}_share"),
                         irrelevance.get(f"distance_irrelevance_L{l}"), means[f"mlp_L{l}"]))
        return rows

    def top_heads(self, k: int = 3) -> list[tuple[str, float]]:
        """The k heads with the largest |mean DLA score|: [(name 'L{l}H{h}', mean score)]."""
        heads = {n: v for n, v in self.dla.means().items() if n.startswith("L") and "H" in n}
        return sorted(heads.items(), key=lambda kv: -abs(kv[1]))[:k]

    def top_neurons(self, k: int = 10) -> list[tuple[int, float]]:
        """The k neurons of the last MLP with the largest |mean DLA score|: [(index, mean score)]."""
        vals, idx = self.dla.neurons.abs().topk(min(k, self.dla.neurons.numel()))
        return [(int(i), float(self.dla.neurons[i])) for i in idx]


def probe_run(run, step: int, model=None) -> Probe:
    """Probe of `run` (a geolens.runs.run.Run) at its checkpoint nearest `step`, or of `model`, the run's model
    at exactly epoch `step` (geolens.training.replay.model_at_epoch): metrics and DLA from one AnalysisContext
    (one forward over every input); the full cache on first access of .cache."""
    from geolens.analysis import AnalysisContext, compute_metrics
    from geolens.analysis.registry import topology_reason

    nearest = step if model is not None else run.nearest_step(step)
    model = model if model is not None else run.model_at(nearest)
    reason = topology_reason("dla", model.cfg)
    if reason is not None:
        raise GeoError(f"probe reads the circuit of [a, b, =] models; {run.path}: {reason}; use geolens "
                       "analyze (its topology-free metrics) or model.run_with_cache")
    ctx = AnalysisContext(model, model.cfg, run.dataset)  # the config that held at that step (Run.config_at)
    metrics, skipped = compute_metrics(context=ctx, num_threads=1)
    return Probe(step, nearest, model, ctx, metrics, skipped, ctx.dla)


def describe(probe: Probe) -> list[tuple[str, str]]:
    """(label, text) lines for the CLI."""
    m = probe.metrics
    lines = [("checkpoint", f"epoch {probe.step}" + ("" if probe.step == probe.requested else
                                                     f" (nearest checkpoint to requested epoch {probe.requested})"))]
    loss = m.get("loss", {})
    lines.append(("accuracy", f"train {loss.get('acc_train', float('nan')):.4f}, test {loss.get('acc_test', float('nan')):.4f}"))
    last = probe.model.cfg.n_layers - 1
    where = f", layer {last}" if last else ""  # the metrics that read W_L or the MLP read the last layer
    if probe.key_freqs:
        lines.append((f"key frequencies (W_L FFT{where})", ", ".join(map(str, probe.key_freqs))))
        per_key = [f"k={k}: U {u:.1f}%, V {v:.1f}%" for k, (u, v) in probe.fve.items()]
        lines.append(("fve_paper", "; ".join(per_key) or probe.skipped.get("fve_paper", "n/a")))
    else:
        lines.append(("key frequencies", probe.skipped.get("keyfreq_wl_fft", "n/a")))
    gs = m.get("grad_symmetricity", {}).get("grad_symmetricity")
    di = m.get("distance_irrelevance", {}).get("distance_irrelevance")
    detail = ", ".join(f"{n} {v:.3f}" for n, v in (("grad_symmetricity", gs), ("distance_irrelevance", di)) if v is not None)
    lines.append(("clock / pizza", f"{probe.verdict}" + (f" ({detail})" if detail else "")))
    lines.append((f"top heads by DLA [{probe.dla.units.split(':')[0]}]",
                  ", ".join(f"{n} {v:+.3f}" for n, v in probe.top_heads())))
    lines.append((f"top neurons by DLA{where and f' (layer {last} MLP)'}",
                  ", ".join(f"#{i} {v:+.4f}" for i, v in probe.top_neurons())))
    for l, keys, share, irrelevance, mlp in probe.layer_rows():
        parts = [f"MLP direct path keys {', '.join(map(str, keys))}" + ("" if share is None else f" (share {share:.2f})")
                 ] if keys else []  # S_n: no key frequencies (the key-frequency row above says why)
        parts.append(f"MLP DLA {mlp:+.3f}")
        if irrelevance is not None:
            parts.append(f"distance_irrelevance {irrelevance:.3f}")
        lines.append((f"layer {l}", "; ".join(parts)))
    return lines
