"""Probe the circuit at one training step: key frequencies, FVE, Clock/Pizza verdict, top heads and
neurons by direct logit attribution. Used by `geolens probe` and `Run.probe`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformer_lens.ActivationCache import ActivationCache

from geolens.model import GeoTransformer


@dataclass
class Probe:
    """The circuit at `step` (the checkpoint nearest the `requested` epoch).

    cache: ActivationCache of the model over every input of the task (a-major order);
    metrics / skipped: compute_metrics output; dla: circuit.DLAResult over every input.
    """

    requested: int
    step: int
    model: GeoTransformer
    cache: ActivationCache
    metrics: dict[str, dict[str, float]]
    skipped: dict[str, str]
    dla: object

    @property
    def key_freqs(self) -> list[int]:
        vals = self.metrics.get("keyfreq_wl_fft", {})
        return [int(v) for k, v in sorted(vals.items()) if k[len("keyfreq_wl_fft_"):].isdigit() and v == v]

    @property
    def verdict(self) -> str:
        from geolens.analysis.clockpizza import VERDICT_CODES

        code = self.metrics.get("clock_pizza", {}).get("clock_pizza")
        if code is None:
            return f"n/a ({self.skipped.get('clock_pizza', 'not computed')})"
        return next(name for name, c in VERDICT_CODES.items() if c == code or (c != c and code != code))

    def top_heads(self, k: int = 3) -> list[tuple[str, float]]:
        heads = {n: v for n, v in self.dla.means().items() if n.startswith("L") and "H" in n}
        return sorted(heads.items(), key=lambda kv: -abs(kv[1]))[:k]

    def top_neurons(self, k: int = 10) -> list[tuple[int, float]]:
        vals, idx = self.dla.neurons.abs().topk(min(k, self.dla.neurons.numel()))
        return [(int(i), float(self.dla.neurons[i])) for i in idx]


def probe_run(run, step: int) -> Probe:
    from geolens.analysis import compute_metrics
    from geolens.analysis.circuit import direct_logit_attribution
    from geolens.analysis.eqforward import eq_from_cache

    nearest = run.nearest_step(step)
    model = run.model_at(nearest)
    metrics, skipped = compute_metrics(model, run.config, run.dataset, num_threads=1)
    with torch.no_grad():
        logits, cache = model.run_with_cache(run.dataset.tokens)
    dla = direct_logit_attribution(model, run.config, eq_from_cache(logits, cache, run.config), run.dataset.labels)
    return Probe(step, nearest, model, cache, metrics, skipped, dla)


def describe(probe: Probe) -> list[tuple[str, str]]:
    """(label, text) lines for the CLI."""
    m = probe.metrics
    lines = [("checkpoint", f"epoch {probe.step}" + ("" if probe.step == probe.requested else
                                                     f" (nearest checkpoint to requested epoch {probe.requested})"))]
    loss = m.get("loss", {})
    lines.append(("accuracy", f"train {loss.get('acc_train', float('nan')):.4f}, test {loss.get('acc_test', float('nan')):.4f}"))
    if probe.key_freqs:
        lines.append(("key frequencies (W_L FFT)", ", ".join(map(str, probe.key_freqs))))
        fve = m.get("fve_paper", {})
        per_key = [f"k={k}: U {fve.get(f'fve_paper_U_{r + 1}', float('nan')):.1f}%, V {fve.get(f'fve_paper_V_{r + 1}', float('nan')):.1f}%"
                   for r, k in enumerate(probe.key_freqs)]
        lines.append(("fve_paper", "; ".join(per_key)))
    else:
        lines.append(("key frequencies", probe.skipped.get("keyfreq_wl_fft", "n/a")))
    gs = m.get("grad_symmetricity", {}).get("grad_symmetricity")
    di = m.get("distance_irrelevance", {}).get("distance_irrelevance")
    detail = ", ".join(f"{n} {v:.3f}" for n, v in (("grad_symmetricity", gs), ("distance_irrelevance", di)) if v is not None)
    lines.append(("clock / pizza", f"{probe.verdict}" + (f" ({detail})" if detail else "")))
    lines.append((f"top heads by DLA [{probe.dla.units.split(':')[0]}]",
                  ", ".join(f"{n} {v:+.3f}" for n, v in probe.top_heads())))
    lines.append(("top neurons by DLA", ", ".join(f"#{i} {v:+.4f}" for i, v in probe.top_neurons())))
    return lines
