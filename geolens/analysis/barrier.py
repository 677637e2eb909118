"""Loss barriers: the train and test loss along the straight line between two checkpoints.

    theta(alpha) = (1 - alpha) theta_A + alpha theta_B,  alpha in [0, 1]
    barrier      = max over alpha of  L(theta(alpha)) - ((1 - alpha) L(theta_A) + alpha L(theta_B))

for the mean cross-entropy at `=` on the training and on the test split (the barrier is 0 when the loss
along the line never rises above the chord, and exactly 0 between a checkpoint and itself). Both
checkpoints must be models of one forward (the same config up to training settings: optimizer, schedule,
seed, ...) on one data split; the line is evaluated with the first run's config (A's tau included).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from geolens.errors import GeoError
from geolens.model.config import config_fields
from geolens.model.engines import choose_engine
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer

#: fields two checkpoints may differ in and still define one loss surface (how they were trained, not the model)
TRAINING_FIELDS = config_fields(surface=False)
N_ALPHAS = 21


@dataclass
class Barrier:
    """The losses along the line (alphas [k]) and each split's barrier height and where it peaks."""

    a: str
    b: str
    alphas: list[float]
    train_loss: list[float]
    test_loss: list[float]
    train_acc: list[float]
    test_acc: list[float]
    barrier_train: float
    barrier_test: float
    argmax_train: float
    argmax_test: float

    def to_dict(self) -> dict:
        return asdict(self)


def check_same_surface(cfg_a, cfg_b) -> None:
    """A GeoError unless the two configs define one model and split (they differ only in TRAINING_FIELDS)."""
    a, b = cfg_a.to_dict(), cfg_b.to_dict()
    differ = sorted(k for k in a if k not in TRAINING_FIELDS and a[k] != b[k])
    if differ:
        raise GeoError(f"the two checkpoints are different models or splits ({', '.join(f'{k}: {a[k]!r} vs {b[k]!r}' for k in differ)}); "
                       "a barrier needs two checkpoints of one architecture on one data split")


def height(losses: list[float], alphas: list[float]) -> tuple[float, float]:
    """(max over alpha of loss minus the chord between the end points, the alpha where it is reached)."""
    chord = [(1 - t) * losses[0] + t * losses[-1] for t in alphas]
    gaps = [x - c for x, c in zip(losses, chord)]
    i = max(range(len(gaps)), key=gaps.__getitem__)
    return max(gaps[i], 0.0), alphas[i]


@torch.no_grad()
def loss_barrier(model_a: GeoTransformer, model_b: GeoTransformer, n_alphas: int = N_ALPHAS, labels: tuple[str, str] = ("A", "B")
                 ) -> Barrier:
    """The Barrier of the line from model_a's parameters to model_b's (module docstring)."""
    check_same_surface(model_a.cfg, model_b.cfg)
    cfg = model_a.cfg
    data = make_dataset(cfg)
    engine, _ = choose_engine(cfg, "auto")
    line = GeoTransformer(cfg)
    line.unembed.tau = model_a.unembed.tau
    pa, pb = dict(model_a.named_parameters()), dict(model_b.named_parameters())
    alphas = [i / (n_alphas - 1) for i in range(n_alphas)]
    curves = {k: [] for k in ("train_loss", "test_loss", "train_acc", "test_acc")}
    for t in alphas:
        for name, p in line.named_parameters():
            p.copy_(torch.lerp(pa[name].detach(), pb[name].detach(), t))
        for split, (x, y) in (("train", data.train), ("test", data.test)):
            logits = engine.logits(line, x)
            curves[f"{split}_loss"].append(float(F.cross_entropy(logits, y)))
            curves[f"{split}_acc"].append(float((logits.argmax(-1) == y).float().mean()))
    (bt, at), (be, ae) = height(curves["train_loss"], alphas), height(curves["test_loss"], alphas)
    return Barrier(labels[0], labels[1], alphas, **curves, barrier_train=bt, barrier_test=be, argmax_train=at,
                   argmax_test=ae)
