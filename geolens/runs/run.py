"""`Run`: a trained run directory as a Python object (config, metrics, steps, models, dataset).

This layer reads runs and knows nothing of the analysis: geolens.analysis.trajectory and geolens.analysis.probe take
a Run, and geolens.analysis.run_analysis (`geolens.load_run`) adds `run.analyze(...)` and `run.probe(step)`
on top, so the imports go one way.
"""

from __future__ import annotations

import operator
from functools import cached_property
from pathlib import Path
from typing import Any

from geolens.errors import GeoError
from geolens.model.config import GeoConfig
from geolens.model.hyperschedule import parse_hyper_schedule
from geolens.model.transformer import GeoTransformer
from geolens.runs.forecast import ThresholdRule
from geolens.runs.runlock import live_holder
from geolens.runs.storage import RunDir, file_sha256, load_tensors, read_json, read_metrics
from geolens.model.tasks import Dataset, make_dataset


class Run:
    """A run directory, read lazily. `steps` are the checkpointed epochs, ascending."""

    def __init__(self, path: str | Path):
        self.dir = RunDir(path)
        self.header: dict[str, Any] = self.dir.read_header()
        self.config = GeoConfig.from_dict(self.header["config"])

    @property
    def path(self) -> Path:
        return self.dir.path

    @cached_property
    def metrics(self) -> list[dict[str, float]]:
        """One dict per evaluation (columns: storage.METRIC_COLUMNS)."""
        return read_metrics(self.dir.metrics_csv)

    @property
    def events(self) -> dict[str, Any]:
        return read_json(self.dir.events_json) if self.dir.events_json.exists() else {}

    @cached_property
    def parent(self) -> "Run | None":
        """The parent whose checkpoints a fork reads for its epochs before the fork step (run.json
        `fork.parent_checkpoints`: forks written since the fork kept no copies); None for a run that holds its
        whole history. A GeoError when the parent is missing or now holds another run."""
        fork = self.header.get("fork")
        if not isinstance(fork, dict) or "parent_checkpoints" not in fork:
            return None
        path = Path(fork["parent"])
        where = f"{self.path} is a fork of {path}, whose checkpoints before epoch {fork['step']} it reads"
        if not (path / "run.json").is_file():
            raise GeoError(f"{where}, but {path} is missing (moved or deleted); restore it at that path")
        parent = Run(path)
        if parent.config.sha256() != fork["parent_identity"]["config_sha256"]:
            raise GeoError(f"{where}, but {path} now holds another run (its config differs); restore the original parent there")
        return parent

    @property
    def fork_start(self) -> int | None:
        """A fork's step when its earlier checkpoints are its parent's (Run.parent), else None."""
        fork = self.header.get("fork")
        return fork["step"] if isinstance(fork, dict) and "parent_checkpoints" in fork else None

    @property
    def manifest(self) -> list[dict[str, Any]]:
        """The manifest entries of every checkpoint of the trajectory: a fork's parent's before its step, then its own."""
        own = self.dir.read_manifest()
        if self.fork_start is None:
            return own
        wanted = {int(k) for k in self.header["fork"]["parent_checkpoints"]}
        inherited = [m for m in self.parent.manifest if m["step"] in wanted]
        if len(inherited) != len(wanted):
            lost = sorted(wanted - {m["step"] for m in inherited})
            raise GeoError(f"{self.parent.path} no longer lists checkpoint(s) {lost[:6]} that its fork {self.path} reads; "
                           "restore the parent run")
        return inherited + own

    def checkpoint_file(self, step: int) -> Path:
        """The file of checkpoint `step`: the run's own, or for a fork's epoch before its step its parent's,
        checked against the SHA-256 recorded when the fork was made (a parent retrained since is refused)."""
        start = self.fork_start
        if start is None or step >= start:
            return self.dir.ckpt_path(step)
        path = self.parent.checkpoint_file(step)
        want = self.header["fork"]["parent_checkpoints"].get(str(step))
        if want is not None and self._verified.get(step) != want:
            if file_sha256(path) != want:
                raise GeoError(f"checkpoint {step} of {self.parent.path} is not the one its fork {self.path} was made "
                               "from (the parent was retrained or changed); restore the parent run")
            self._verified[step] = want
        return path

    @cached_property
    def _verified(self) -> dict[int, str]:
        return {}

    @property
    def steps(self) -> list[int]:
        return [m["step"] for m in self.manifest]

    @cached_property
    def dataset(self) -> Dataset:
        return make_dataset(self.config)

    def nearest_step(self, step: int) -> int:
        """The checkpointed epoch closest to `step` (ties go to the earlier one); `step` must be an integer
        epoch between the first and the last checkpoint."""
        try:
            step = operator.index(step)
        except TypeError:
            raise GeoError(f"step {step!r} is not an integer epoch; pass e.g. 800") from None
        steps = self.steps
        if not steps:
            raise GeoError(f"{self.path} has no checkpoints yet ({self.dir.manifest_json} is empty or missing)")
        if not steps[0] <= step <= steps[-1]:
            raise GeoError(f"epoch {step} is outside the trajectory of {self.path} (checkpoints from epoch {steps[0]} "
                           f"to {steps[-1]}); choose an epoch in that range")
        return min(steps, key=lambda s: (abs(s - step), s))

    @property
    def forks(self) -> list[dict]:
        """The fork records of its lineage (run.json `fork`, then each `parent_fork`), newest first; [] for a
        run trained from scratch."""
        out, fork = [], self.header.get("fork")
        while fork:
            out.append(fork)
            fork = fork.get("parent_fork")
        return out

    def config_at(self, step: int, scheduled_tau: bool = True) -> GeoConfig:
        """The config that held at epoch `step`: before a fork's step its parent's (run.json `fork`
        changes undone, generation by generation), with tau at its scheduled value (model.hyperschedule)
        unless scheduled_tau is False."""
        values = self.config.to_dict()
        for fork in self.forks:
            if step >= fork["step"]:
                break
            values.update({k: v["from"] for k, v in fork["changes"].items()})
        cfg = GeoConfig.from_dict(values)
        tau = parse_hyper_schedule(cfg.schedule).value("tau", cfg.tau, step) if scheduled_tau else cfg.tau
        return cfg if tau == cfg.tau else cfg.replace(tau=tau)

    def model_at(self, step: int) -> GeoTransformer:
        """The model at checkpointed epoch `step` (use nearest_step for any other epoch)."""
        if step not in self.steps:
            raise GeoError(
                f"{self.path} has no checkpoint at epoch {step}; the nearest is {self.nearest_step(step)} "
                "(see run.steps)"
            )
        model = GeoTransformer(self.config_at(step))
        path = self.checkpoint_file(step)
        state = load_tensors(path)
        try:
            model.load_state_dict(state)
        except RuntimeError as e:
            raise GeoError(f"checkpoint {path} does not match the run's config: {e}") from None
        return model.eval()

    def _model_text(self) -> str:
        """The topology in words: '2 layers, post-norm sphere,layernorm, bounded readout, learned attention'."""
        cfg = self.config
        layers = f"{cfg.n_layers} layer{'s' if cfg.n_layers > 1 else ''}"
        return (f"{layers}, {cfg.norm_placement}-norm {cfg.norm}, {cfg.unembed} readout, {cfg.attention} attention"
                + (", causal" if cfg.causal else ""))

    def summary(self, forecast: ThresholdRule | None = None) -> dict[str, Any]:
        """What `geolens info` prints; forecast: a rule to replay on the record (default: the one the run
        was trained with, run.json `forecast`)."""
        rows = self._readable(lambda: self.metrics) or []
        steps = self._readable(lambda: self.steps)
        events = self._readable(lambda: self.events) or {}
        last = rows[-1] if rows else {}
        timing = self.header.get("timing", {})
        return {
            "path": str(self.path),
            "preset": self.config.preset,
            "task": self.config.task,
            "p": self.config.p if self.config.task != "perm" else None,
            "n_perm": self.config.n_perm if self.config.task == "perm" else None,
            "seed": self.config.seed,
            "data_seed": self.config.data_seed,
            "model": self._model_text(),
            "lr": self.config.lr,
            "weight_decay": self.config.weight_decay,
            "optimizer": self.config.optimizer,
            "status": self._status_text(last.get("epoch")),
            "engine": self.header.get("engine"),
            "split": f"{self.header.get('n_train')} train / {self.header.get('n_test')} test",
            "last_epoch": last.get("epoch"),
            "train_acc": last.get("train_acc"),
            "test_acc": last.get("test_acc"),
            "test_loss": last.get("test_loss"),
            "onset_095": events.get("onset_095"),
            "forecast": self._forecast_text(forecast, rows, events.get("onset_095")),
            "sustained_099": events.get("sustained_099"),
            "stop_reason": events.get("stop_reason"),
            "checkpoints": "unreadable manifest" if steps is None else len(steps),
            "trimmed": self._trimmed_text(),
            "forked_from": self._fork_text(),
            "trained_by": self._segments_text(),
            "ms_per_epoch": round(timing["ms_per_epoch"], 2) if "ms_per_epoch" in timing else None,
        }

    def _status_text(self, last_epoch: int | None) -> str | None:
        """run.json's status, except that a run marked running whose writer is gone (killed, or its machine
        went down) is 'stopped' with how to continue it."""
        status = self.header.get("status")
        if status != "running" or live_holder(self.path) is not None:
            return status
        return (f"stopped at epoch {last_epoch} (no process is training it: it was killed or interrupted); "
                f"`geolens train --resume --out {self.path}` continues it")

    def _forecast_text(self, rule: ThresholdRule | None, rows: list[dict], onset: int | None) -> str | None:
        """When and what the forecast rule forecast, beside the measured onset."""
        if rule is None and "forecast" in self.header:
            rule = ThresholdRule.from_dict(self.header["forecast"])
        if rule is None:
            return None
        fired = rule.first_firing(rows)
        if fired is None:
            return f"{rule.describe()} has not fired (last epoch {rows[-1]['epoch'] if rows else 0:,})"
        measured = "no onset yet" if onset is None else f"measured {onset:,} (error {onset - fired - rule.lead:+,.0f})"
        return f"{rule.describe()} fired at {fired:,}: {rule.expected(fired)}; {measured}"

    def _fork_text(self) -> str | None:
        """The lineage of a fork (run.json `fork`), one line per generation: parent, step and changes."""
        lines = []
        for fork in self.forks:
            changes = ", ".join(f"{k} {v['from']} -> {v['to']}" for k, v in fork["changes"].items()
                                if k not in ("epochs", "preset"))
            lines.append(f"{fork['parent']} at epoch {fork['step']} ({changes or 'no change'})")
        return "\n".join(lines) or None

    def _segments_text(self) -> str | None:
        """Who trained which epochs (run.json segments), one line per training start: the geolens
        version and commit, and the machine where recorded (another machine trains in another float order)."""
        lines = []
        for seg in self.header.get("segments", []):
            commit = seg.get("geolens_commit")
            dirty = "+dirty" if commit and commit.endswith("+dirty") else ""
            made = "(commit not recorded)" if commit is None else commit[:7] + dirty
            text = f"from epoch {seg.get('from_epoch')}: geolens {seg.get('geolens')} {made}"
            machine = seg.get("machine")
            if isinstance(machine, dict):
                gpu = f", {machine['gpu']}" if "gpu" in machine else ""
                threads = f"{machine.get('torch_threads')} thread(s)"
                text += f" on {machine.get('cpu')} ({machine.get('cpu_capability')}, {threads}{gpu})"
            lines.append(text)
        return "\n".join(lines) or None

    def _trimmed_text(self) -> str | None:
        """For a trimmed copy (`geolens export`): how many of its source's checkpoints it keeps."""
        t = self.header.get("trimmed")
        if not isinstance(t, dict):
            return None
        return (f"{t.get('checkpoints')} of {t.get('source_checkpoints')} checkpoints of {t.get('source')} "
                f"(exported {t.get('date')}; no resume state: analysis only)")

    @staticmethod
    def _readable(read):
        """read() or None when the file it reads is missing or damaged (the summary shows what it can)."""
        try:
            return read()
        except GeoError:
            return None


def load_run(path: str | Path) -> Run:
    """Open a run directory written by `geolens train` (data only; geolens.load_run adds analyze and probe)."""
    return Run(path)
