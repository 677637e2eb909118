"""`geolens table`: the paper's tables rebuilt from run directories, next to the published numbers.

Per configuration (runset.RunGroup) the onsets (or, for the uniform-attention tables, the peak
test accuracies) of its seeds on the paper's evaluation grid and at the runs' own resolution,
their summary (stats.Summary: mean, sample std, range, Student-t 95% interval of the mean), failures, the matching
published row (paper.PaperTable.match) and a verdict (stats.verdict on the grid values). The
definitions are in docs/cli.md ("geolens table"); the CSV columns are documented there too.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geolens.analysis.significance import fmt_p, holm, smaller_than
from geolens.errors import GeoError
from geolens.model.config import config_fields
from geolens.outputs.paper import TABLES, PaperRow, PaperTable, paper_table
from geolens.outputs.stats import Summary, summarize, verdict
from geolens.runs.run import Run
from geolens.runs.runset import RunGroup, found_runs, group_key, group_runs
from geolens.runs.storage import atomic_write_bytes


# ---- what one run contributes ------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """How runs are measured: onset = first evaluated epoch with test acc > threshold (>= when
    inclusive); the paper's grid = evaluated epochs that are multiples of `grid`."""

    threshold: float = 0.95
    inclusive: bool = False
    grid: int = 200

    @classmethod
    def of(cls, table: PaperTable | None) -> "Rule":
        return cls() if table is None else cls(table.threshold, table.inclusive, table.grid)

    def reached(self, acc: float) -> bool:
        return acc >= self.threshold if self.inclusive else acc > self.threshold

    def on_grid(self, rows: list[dict]) -> list[dict]:
        return [r for r in rows if r["epoch"] % self.grid == 0]

    def onset(self, rows: list[dict]) -> int | None:
        """First epoch of `rows` whose test accuracy reaches the threshold."""
        return next((r["epoch"] for r in rows if self.reached(r["test_acc"])), None)


@dataclass(frozen=True)
class RunMeasures:
    """One run's numbers: onsets (None: no onset within its epochs) and peak test accuracy, on the
    paper's grid and at the run's own resolution, and events.json's sustained_099; commits: the geolens
    commits that trained it (run.json segments, "epoch:commit" joined by spaces; "" when not recorded)."""

    path: Path
    seed: int
    data_seed: int
    final_epoch: int
    eval_every: int
    onset_grid: int | None
    onset_own: int | None
    sustained_099: int | None
    peak_grid: float
    peak_own: float
    commits: str

    @classmethod
    def of(cls, run: Run, rule: Rule) -> "RunMeasures":
        rows = run.metrics
        grid = rule.on_grid(rows)
        return cls(run.path, run.config.seed, run.config.data_seed, rows[-1]["epoch"], run.config.eval_every,
                   rule.onset(grid), rule.onset(rows), run.events.get("sustained_099"),
                   max((r["test_acc"] for r in grid), default=math.nan), max(r["test_acc"] for r in rows),
                   " ".join(f"{seg['from_epoch']}:{seg['geolens_commit'] or '?'}" for seg in run.header.get("segments", [])))


# ---- one row of a table ------------------------------------------------------------------------
@dataclass(frozen=True)
class AgainstLayerNorm:
    """A row's onsets against its LayerNorm baseline in the same table (against_layernorm): the ratio of the
    mean grid onsets (row / LayerNorm, over the seeds with one), the one-sided exact Mann-Whitney p-value that
    the row's grid onsets come earlier (significance.smaller_than: a seed without an onset ranks last) and that
    p Holm-corrected over the table's comparisons."""

    ratio: float | None
    p: float | None
    p_holm: float | None


@dataclass
class TableRow:
    """A published row and/or one configuration of ours (a paper row no run matched has group
    None; a configuration that matched no row has paper None and `note` says why)."""

    paper: PaperRow | None
    group: RunGroup | None
    measures: list[RunMeasures]
    kind: str  # onset | peak
    note: str = ""
    paper_epochs: int | None = None  # the paper's epoch budget, when it is one number
    against_ln: AgainstLayerNorm | None = None  # onset tables: set by against_layernorm where LayerNorm has a row

    def values(self, what: str) -> list[float]:
        """Successful seeds' values: 'onset_grid', 'onset_own', 'sustained_099', 'peak_grid', 'peak_own'."""
        return [v for v in (getattr(m, what) for m in self.measures) if v is not None and not math.isnan(v)]

    def summary(self, what: str) -> Summary:
        return summarize(self.values(what))

    @property
    def headline(self) -> str:
        """The measure the verdict compares: the onset or the peak accuracy on the paper's grid."""
        return "onset_grid" if self.kind == "onset" else "peak_grid"

    def failures(self, what: str) -> int:
        return len(self.measures) - len(self.values(what))

    def full_success(self, what: str) -> int:
        return sum(1 for v in self.values(what) if v >= 1.0)

    @property
    def budget(self) -> int | None:
        """The fewest epochs trained by a seed that more epochs could change: for onsets the seeds without
        one (a seed that grokked and stopped early does not count), for peaks every seed (None without runs)."""
        pending = [m for m in self.measures if self.kind == "onset" and getattr(m, self.headline) is None]
        return min((m.final_epoch for m in pending or self.measures), default=None)

    @property
    def verdict(self) -> str:
        """agrees / differs (geolens.outputs.stats.verdict) / n/a; 'open (N of M epochs)' when our runs had a
        smaller budget than the paper's and more epochs could still change the answer: seeds without
        an onset, or a peak accuracy below the paper's (peaks only rise with more epochs). A paper row
        without a mean (only failures) stays n/a: its failure counts are the comparison."""
        if self.paper is None:
            return "n/a"
        ours = self.summary(self.headline)
        if self.kind == "onset":
            found = verdict(ours, self.paper.get("mean"), self.paper.get("min"), self.paper.get("max"))
            unsettled = self.paper.get("mean") is not None and self.failures(self.headline) > 0
        else:
            paper_mean = self.paper.get("mean_peak_acc")
            found = verdict(ours, paper_mean)
            unsettled = found != "agrees" and paper_mean is not None and (ours.n == 0 or ours.mean < paper_mean)
        if unsettled and self.budget is not None and self.paper_epochs is not None and self.budget < self.paper_epochs:
            return f"open ({self.budget:,} of {self.paper_epochs:,} epochs)"
        return found

    def record(self, table: str, rule: Rule) -> dict[str, Any]:
        """The CSV row (columns: docs/cli.md, "geolens table")."""
        g, p = self.group, self.paper
        cfg = g.config if g else None
        rec: dict[str, Any] = {
            "table": table,
            "paper_config": p.config if p else "",
            "paper_lr": p.lr if p else "",
            "paper_wd": p.wd if p and p.wd is not None else "",
            "config": g.variant if g else "",
            "lr": cfg.lr if cfg else "",
            "weight_decay": cfg.weight_decay if cfg else "",
            "task": cfg.task_label if cfg else "",
            "group": g.full_label if g else "",
            "presets": " ".join(sorted({r.config.preset for r in g.runs})) if g else "",
            "seeds": " ".join(map(str, g.seeds)) if g else "",
            "runs": len(self.measures),
            "epochs": _span(r.config.epochs for r in g.runs) if g else "",
            "eval_every": _span(m.eval_every for m in self.measures),
            "threshold": rule.threshold,
            "inclusive": rule.inclusive,
            "grid": rule.grid,
        }
        if self.kind == "onset":
            for what in ("onset_grid", "onset_own"):
                rec.update(self.summary(what).fields(what))
                rec[f"{what}_failures"] = self.failures(what)
            s = self.summary("sustained_099")
            rec.update({k: v for k, v in s.fields("sustained_099").items() if not k.endswith(("_lo", "_hi"))})
            rec.update(paper_n=p.seeds if p else "", paper_mean=_get(p, "mean"), paper_std=_get(p, "std"),
                       paper_min=_get(p, "min"), paper_max=_get(p, "max"),
                       paper_failures=_none(p.failures) if p else "")
        else:
            for what in ("peak_grid", "peak_own"):
                rec.update(self.summary(what).fields(what))
                rec[f"{what}_full_success"] = self.full_success(what)
            rec.update(paper_n=p.seeds if p else "", paper_mean_peak=_get(p, "mean_peak_acc"),
                       paper_max_peak=_get(p, "max_peak_acc"), paper_full_success=_none(p.full_success) if p else "")
        if self.kind == "onset":
            a = self.against_ln
            rec.update(ln_ratio=_none(a and a.ratio), ln_p=_none(a and a.p), ln_p_holm=_none(a and a.p_holm))
        rec.update(verdict=self.verdict, note=self.note)
        return rec


def _get(p: PaperRow | None, key: str) -> Any:
    return "" if p is None or p.get(key) is None else p.get(key)


def _none(x: Any) -> Any:
    return "" if x is None else x


def _span(values) -> str:
    vals = sorted(set(values))
    return "" if not vals else str(vals[0]) if len(vals) == 1 else f"{vals[0]}-{vals[-1]}"


# ---- a whole table -----------------------------------------------------------------------------
@dataclass
class BuiltTable:
    """A table ready to print and write: `name` is the file stem (table1 ... appendixB, or 'onsets'
    for configurations no paper table covers)."""

    name: str
    title: str
    kind: str
    rule: Rule
    paper: PaperTable | None
    rows: list[TableRow]
    notes: list[str] = field(default_factory=list)

    def records(self) -> list[dict[str, Any]]:
        return [row.record(self.name, self.rule) for row in self.rows]

    def run_records(self) -> list[dict[str, Any]]:
        """One record per run (the per-seed values behind the summaries)."""
        out = []
        for row in self.rows:
            for m in row.measures:
                out.append({"table": self.name, "paper_config": row.paper.config if row.paper else "",
                            "config": row.group.variant, "lr": row.group.config.lr, "weight_decay": row.group.config.weight_decay,
                            "path": str(m.path), "seed": m.seed, "data_seed": m.data_seed, "final_epoch": m.final_epoch,
                            "eval_every": m.eval_every, "onset_grid": _none(m.onset_grid), "onset_own": _none(m.onset_own),
                            "sustained_099": _none(m.sustained_099), "peak_grid": m.peak_grid, "peak_own": m.peak_own,
                            "geolens_commits": m.commits})
        return out


#: the fields a row may differ from its LayerNorm baseline in (the topology compared, and the initialisation)
COMPARED = config_fields(tables="compared")


def is_layernorm(group: RunGroup) -> bool:
    """Whether the group is a LayerNorm baseline that onset rows are compared with: LayerNorm in every layer (either
    readout), no Fourier init, not a fork."""
    return group.config.norm == "layernorm" and not group.config.fourier_init and not group.fork


def against_layernorm(rows: list[TableRow]) -> None:
    """Set each onset row's against_ln (AgainstLayerNorm) where the table holds one LayerNorm baseline (is_layernorm)
    equal to the row's configuration in every field but COMPARED and the bookkeeping ones (the same lr, task,
    attention, depth, placement, ...) and the row is another configuration with runs; Holm over those tests."""
    def key(g: RunGroup) -> str:
        return group_key(g.config, ignoring=COMPARED)

    baselines: dict[str, list[TableRow]] = {}
    for r in rows:
        if r.group is not None and is_layernorm(r.group):
            baselines.setdefault(key(r.group), []).append(r)
    pairs = [(r, ln[0]) for r in rows if r.kind == "onset" and r.group is not None and not is_layernorm(r.group)
             and len(ln := baselines.get(key(r.group), [])) == 1]
    ps = [smaller_than([m.onset_grid for m in r.measures], [m.onset_grid for m in ln.measures]) for r, ln in pairs]
    for (r, ln), p, adjusted in zip(pairs, ps, holm(ps)):
        ours, theirs = r.summary("onset_grid"), ln.summary("onset_grid")
        ratio = ours.mean / theirs.mean if ours.n and theirs.n else None
        r.against_ln = AgainstLayerNorm(ratio, p, adjusted)


def build_table(groups: list[RunGroup], table: PaperTable | None) -> BuiltTable:
    """Every published row of `table` (in the paper's order) with the groups that reproduce it, then
    the groups that match no row; `table` None: the groups without paper comparison. Onset rows are
    compared with LayerNorm's (against_layernorm)."""
    built = _build_table(groups, table)
    against_layernorm(built.rows)
    return built


def _build_table(groups: list[RunGroup], table: PaperTable | None) -> BuiltTable:
    rule = Rule.of(table)
    kind = table.kind if table else "onset"

    def row(paper, group, note=""):
        measures = [RunMeasures.of(r, rule) for r in group.runs] if group else []
        return TableRow(paper, group, measures, kind, note, table.epochs if table else None)

    if table is None:
        return BuiltTable("onsets", "Grokking onsets (no paper table covers these configurations)", kind, rule, None,
                          [row(None, g) for g in groups], grid_notes(groups, rule))
    matched: dict[int, list[RunGroup]] = {}
    unmatched: list[tuple[RunGroup, str]] = []
    rows = table.rows()
    for g in groups:
        hit, why = (None, "a fork is no experiment of the paper") if g.fork else table.match(g.config)
        if hit is None:
            unmatched.append((g, why))
        else:
            matched.setdefault(rows.index(hit), []).append(g)
    out = []
    for i, paper in enumerate(rows):
        out += [row(paper, g) for g in matched[i]] if i in matched else [row(paper, None)]
    out += [row(None, g, f"matched no paper row: {why}") for g, why in unmatched]
    notes = [f"{g.full_label}: matched no paper row ({why})" for g, why in unmatched]
    notes += [f"paper {p.label}: {p.values['note']}" for p in rows if "note" in p.values]
    notes += list(table.notes)
    if table.epochs is not None:
        notes += [f"{g.full_label}: trained for {_epoch_span(g.epochs)} epochs, the paper {table.epochs:,}"
                  for gs in matched.values() for g in gs if g.epochs[0] < table.epochs]
    return BuiltTable(table.name, table.title, kind, rule, table, out, notes + grid_notes(groups, rule))


def _epoch_span(lo_hi: tuple[int, int]) -> str:
    """'3,000' or '3,000-20,000'."""
    lo, hi = lo_hi
    return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"


def grid_notes(groups: list[RunGroup], rule: Rule) -> list[str]:
    """A note for each group whose evaluation interval does not divide the paper's grid."""
    out = []
    for g in groups:
        odd = sorted({r.config.eval_every for r in g.runs if rule.grid % r.config.eval_every})
        if odd:
            out.append(f"{g.full_label}: eval_every {', '.join(map(str, odd))} does not divide {rule.grid}, so its grid "
                       f"values use only the evaluated multiples of {rule.grid}")
    return out


def build_tables(root: str | Path, paper: str | None = None) -> tuple[list[BuiltTable], list[str]]:
    """The tables of the runs under `root` (see tables_for), and notes on the code that trained them
    (runset.provenance_notes) and runs left out."""
    runs, found = found_runs(root)
    built, notes = tables_for(group_runs(runs), paper, root)
    return built, found + notes


def tables_for(groups: list[RunGroup], paper: str | None, root: str | Path) -> tuple[list[BuiltTable], list[str]]:
    """paper None: one table per paper table that claims some configuration (by task and attention),
    plus 'onsets' for configurations none claims. paper 'table1' ...: that table only, with the
    configurations it claims (the others are listed in the returned notes)."""
    notes: list[str] = []
    claimed = {name: [g for g in groups if t.claims(g.config)] for name, t in TABLES.items()}
    if paper is not None:
        table = paper_table(paper)
        others = [g for g in groups if g not in claimed[paper]]
        notes += [f"not part of {paper} ({g.config.task_label}, attention {g.config.attention}): {g.full_label}" for g in others]
        if not claimed[paper]:
            raise GeoError(f"no run under {root} belongs to {paper} (task {table.family['task']}, attention "
                           f"{table.family['attention']}); found: {', '.join(g.full_label for g in groups)}")
        return [build_table(claimed[paper], table)], notes
    built = [build_table(gs, TABLES[name]) for name, gs in claimed.items() if gs]
    rest = [g for g in groups if not any(g in gs for gs in claimed.values())]
    if rest:
        built.append(build_table(rest, None))
    return built, notes


# ---- rendering ---------------------------------------------------------------------------------
def _num(x: float | None, kind: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.0f}" if kind == "onset" else f"{x:.4f}"


def _mean_std(s: Summary, kind: str) -> str:
    if s.n == 0:
        return "-"
    if s.n == 1:
        return f"{_num(s.mean, kind)} (n=1, no std)"
    return f"{_num(s.mean, kind)} ± {_num(s.std, kind)}"


def _range(lo, hi, kind: str) -> str:
    return "-" if lo is None or hi is None or (isinstance(lo, float) and math.isnan(lo)) else f"{_num(lo, kind)}-{_num(hi, kind)}"


def _ci(s: Summary, kind: str) -> str:
    if s.n == 0:
        return "-"
    return "n<2: none" if s.n < 2 else f"[{_num(s.t95_lo, kind)}, {_num(s.t95_hi, kind)}]"


def display(table: BuiltTable) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the printed and Markdown table (the CSV holds every number)."""
    kind, rule = table.kind, table.rule
    if kind == "onset":
        headers = ["paper row", "geolens config", "lr", "wd", "seeds", f"onset (grid {rule.grid}) mean ± std", "min-max",
                   "95% t-interval of mean", "failures", "onset (own) mean ± std", ">= 0.99 held from", "x LayerNorm",
                   "p earlier than LayerNorm (Holm)", "paper mean ± std", "paper min-max", "paper failures", "verdict"]
    else:
        headers = ["paper row", "geolens config", "lr", "wd", "seeds", f"peak test acc (grid {rule.grid}) mean ± std",
                   "min-max", "95% t-interval of mean", "full success", "peak (own) mean", "paper mean peak", "paper max peak",
                   "paper full success", "verdict"]
    out = []
    for row in table.rows:
        g, p = row.group, row.paper
        left = [p.label if p else "(none)", g.variant if g else "(no runs)", f"{g.config.lr:g}" if g else "-",
                f"{g.config.weight_decay:g}" if g else "-", str(len(row.measures)) if g else "-"]
        head = row.summary(row.headline)
        if kind == "onset":
            own, held = row.summary("onset_own"), row.summary("sustained_099")
            paper_n = p.seeds if p else None
            right = [_mean_std(head, kind), _range(head.min, head.max, kind), _ci(head, kind),
                     f"{row.failures('onset_grid')}/{len(row.measures)}" if g else "-", _mean_std(own, kind),
                     _num(held.mean, kind) + (f" ({held.n} runs)" if 0 < held.n < len(row.measures) else ""),
                     *_against(row.against_ln),
                     f"{_num(p.get('mean'), kind)} ± {_num(p.get('std'), kind)}" if p and p.get("mean") is not None else "-",
                     _range(p.get("min"), p.get("max"), kind) if p else "-",
                     f"{p.failures}/{paper_n}" if p and p.failures is not None else "-", row.verdict]
        else:
            own = row.summary("peak_own")
            right = [_mean_std(head, kind), _range(head.min, head.max, kind), _ci(head, kind),
                     f"{row.full_success('peak_grid')}/{len(row.measures)}" if g else "-", _num(own.mean, kind),
                     _num(p.get("mean_peak_acc"), kind) if p else "-", _num(p.get("max_peak_acc"), kind) if p else "-",
                     f"{p.full_success}/{p.seeds}" if p and p.full_success is not None else "-", row.verdict]
        out.append(left + right)
    return headers, out


def _against(a: AgainstLayerNorm | None) -> list[str]:
    """The two cells of a row's comparison with LayerNorm: '0.11', '<0.001 (<0.001)'; '-' without one."""
    if a is None:
        return ["-", "-"]
    return ["-" if a.ratio is None else f"{a.ratio:.2f}", f"{fmt_p(a.p)} ({fmt_p(a.p_holm)})"]


def definitions(table: BuiltTable) -> str:
    """The measurement rule in one paragraph (printed under the table)."""
    rule = table.rule
    op = ">=" if rule.inclusive else ">"
    what = (f"onset = first evaluated epoch with test accuracy {op} {rule.threshold:g}; grid = evaluated epochs that are "
            f"multiples of {rule.grid} (the paper's logging), own = every evaluated epoch; means, std (n - 1), range and "
            f"the 95% t-interval of the mean are over the seeds with an onset; failures = seeds with no onset within "
            f"their epochs; x LayerNorm = the mean grid onset over LayerNorm's (the table's LayerNorm row that differs "
            f"only in norm, readout, weight decay and initialisation: the same lr, task, attention and depth); "
            f"p earlier than LayerNorm = one-sided exact Mann-Whitney p-value that the grid onsets come earlier than "
            f"LayerNorm's (a seed without an onset ranks last), Holm-corrected over the table's comparisons in brackets"
            if table.kind == "onset" else
            f"peak = highest test accuracy over the evaluated epochs that are multiples of {rule.grid} (grid) or over all "
            f"evaluated epochs (own); full success = peak test accuracy 1.0")
    return (f"{what}. 95% t-interval of mean = mean ± t(0.975, n - 1) std / sqrt(n) (Student's t): 95% coverage at "
            "every n >= 2 if the seeds' values are normally distributed, an assumption (not a percentile bootstrap: at "
            "3 seeds that is their range, which covers a symmetric distribution's mean 75% of the time); none for "
            "n < 2. Verdict (on the grid, mean against mean): agrees when the paper's mean lies in our 95% t-interval "
            "of the mean or our mean in the paper's min-max; differs otherwise; n/a when either side has no mean; "
            "open (N of M epochs) when our runs had a smaller epoch budget than the paper's and more epochs could "
            "change the answer (seeds without an onset, or a peak below the paper's).")


def to_markdown(table: BuiltTable, notes: list[str]) -> str:
    headers, rows = display(table)
    lines = [f"# {table.title}", "", definitions(table), "",
             "| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    all_notes = table.notes + notes
    if all_notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in all_notes]
    return "\n".join(lines) + "\n"


def to_csv(records: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    if records:
        w = csv.DictWriter(buf, fieldnames=list(records[0]), lineterminator="\n")
        w.writeheader()
        w.writerows({k: repr(v) if isinstance(v, float) else v for k, v in r.items()} for r in records)
    return buf.getvalue()


def rich_table(table: BuiltTable):
    from rich.table import Table
    from rich.text import Text

    headers, rows = display(table)
    out = Table(title=table.title, caption=definitions(table), caption_justify="left")
    for h in headers:
        out.add_column(h, overflow="fold")
    for row in rows:
        style = {"agrees": "green", "differs": "red"}.get(row[-1], "")
        out.add_row(*map(Text, row[:-1]), Text(row[-1], style=style))
    return out


def write_table(table: BuiltTable, notes: list[str], out: Path) -> list[Path]:
    """OUT/<name>.md, OUT/<name>.csv (one row per table row) and OUT/<name>_runs.csv (one per run)."""
    paths = [out / f"{table.name}.md", out / f"{table.name}.csv", out / f"{table.name}_runs.csv"]
    atomic_write_bytes(paths[0], to_markdown(table, notes).encode())
    atomic_write_bytes(paths[1], to_csv(table.records()).encode())
    atomic_write_bytes(paths[2], to_csv(table.run_records()).encode())
    return paths
