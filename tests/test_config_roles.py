"""Config fields declare their roles once (geolens.model.roles); every module that treats fields differently
derives its field list from the declarations, and nothing a run computes changed when the hand-kept lists went."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from geolens.model import config, roles
from geolens.model.config import GeoConfig

ROOT = Path(__file__).resolve().parent.parent

# The lists each module kept by hand before the roles were declared (commit 00b7238; `keep`, the storage policy,
# added since), pinned: a declaration
# that moves a field in or out of one fails here (and then says what it changes: a hash, a table, a stack).
OLD_LISTS = {
    "fast.FAST_VALUE_FIELDS": {"d_model", "n_heads", "d_head", "d_mlp", "tau", "ln_eps", "rms_eps", "sphere_eps",
                               "causal"},
    "fast.FAST_IGNORED_FIELDS": {"task", "p", "n_perm", "frac_train", "data_seed", "fourier_init", "init", "seed",
                                 "lr", "beta1", "beta2", "weight_decay", "optimizer", "momentum", "muon_lr",
                                 "muon_momentum", "epochs", "eval_every", "checkpoints", "early_stop_after", "engine",
                                 "device", "preset", "schedule", "norm_clamp", "flush_denormal", "keep"},
    "deep.DEEP_VALUE_FIELDS": {"n_layers", "d_model", "n_heads", "d_head", "d_mlp", "tau", "ln_eps", "rms_eps",
                               "sphere_eps", "causal", "p", "n_perm"},
    "deep.DEEP_IGNORED_FIELDS": {"frac_train", "data_seed", "fourier_init", "init", "seed", "lr", "beta1", "beta2",
                                 "weight_decay", "optimizer", "momentum", "muon_lr", "muon_momentum", "epochs",
                                 "eval_every", "checkpoints", "early_stop_after", "engine", "device", "preset",
                                 "schedule", "norm_clamp", "flush_denormal", "keep"},
    "fork.FORWARD_FIELDS": {"norm", "norm_placement", "unembed", "attention", "tau", "ln_eps", "rms_eps", "sphere_eps",
                            "causal", "norm_clamp"},
    "batched.MEMBER_FIELDS": {"seed", "data_seed", "lr", "weight_decay", "beta1", "beta2", "early_stop_after",
                              "preset", "schedule", "norm_clamp"},
    "train.RESUMABLE_FIELDS": {"epochs", "early_stop_after", "device"},
    "barrier.TRAINING_FIELDS": {"seed", "lr", "beta1", "beta2", "weight_decay", "optimizer", "momentum", "muon_lr",
                                "muon_momentum", "epochs", "eval_every", "checkpoints", "early_stop_after", "schedule",
                                "norm_clamp", "engine", "device", "preset", "init", "fourier_init", "flush_denormal", "keep"},
    "config.HASHED_UNLESS_DEFAULT": {"norm_placement", "optimizer", "momentum", "muon_lr", "muon_momentum",
                                     "flush_denormal"},
    "tables.COMPARED": {"norm", "unembed", "weight_decay", "fourier_init", "init"},
    "runset.BOOKKEEPING": {"seed", "data_seed", "preset", "engine", "device", "checkpoints", "early_stop_after",
                           "epochs", "eval_every", "flush_denormal", "keep"},
    "runset.SHOWN": {"norm", "unembed", "weight_decay", "attention", "fourier_init", "init", "lr", "task", "p",
                     "n_perm"},
}
OLD_MAPS = {
    "fork.REFUSED": {
        **{f: "it changes parameter shapes" for f in ("d_model", "d_mlp", "n_heads", "d_head", "n_layers", "p", "task",
                                                      "n_perm")},
        **{f: "the fork trains on the parent's split and data" for f in ("frac_train", "data_seed")},
        **{f: "the fork starts from the parent's weights, not from an initialisation" for f in ("seed", "init",
                                                                                                "fourier_init")},
        "eval_every": "the fork keeps the parent's evaluation record",
    },
    "grid.AXIS_FIELDS": {"preset": "--preset", "seed": "--seeds", "data_seed": "--data-seed", "lr": "--lr",
                         "weight_decay": "--wd", "task": "--task", "p": "--p", "epochs": "--epochs"},
    "grid.SHARED_FIELDS": {"frac": "frac_train", "eval_every": "eval_every", "checkpoints": "checkpoints",
                           "early_stop": "early_stop_after"},
}
MODULES = {"fast": "geolens.model.fast", "deep": "geolens.model.deep", "fork": "geolens.training.fork",
           "batched": "geolens.training.batched", "train": "geolens.training.train", "barrier": "geolens.analysis.barrier",
           "config": "geolens.model.config", "tables": "geolens.outputs.tables", "runset": "geolens.runs.runset",
           "grid": "geolens.sweeps.grid"}


def _derived(qualified: str):
    module, name = qualified.split(".")
    __import__(MODULES[module])
    return getattr(sys.modules[MODULES[module]], name)


@pytest.mark.parametrize("qualified", sorted(OLD_LISTS))
def test_each_derived_list_is_the_old_hand_kept_one(qualified):
    derived = _derived(qualified)
    assert len(set(derived)) == len(derived) and set(derived) == OLD_LISTS[qualified]


@pytest.mark.parametrize("qualified", sorted(OLD_MAPS))
def test_each_derived_mapping_is_the_old_hand_kept_one(qualified):
    assert _derived(qualified) == OLD_MAPS[qualified]


def test_each_engine_computes_the_choices_its_fields_declare():
    from geolens.model import deep, engines, fast

    assert set(roles.ENGINE_SCOPES) == {e.name for e in engines.ENGINES} - {"hooked"}  # hooked runs any config
    assert {f for f, _ in fast._CHOICES} | {"n_layers"} == set(config.config_fields(fast=roles.CHOICE))
    assert {f for f, _ in deep.DEEP_CHOICES} == set(config.config_fields(deep=roles.CHOICE))


def test_a_field_without_roles_is_refused():
    @dataclasses.dataclass
    class Undeclared(GeoConfig):
        new_knob: float = 1.0

    with pytest.raises(TypeError, match="field 'new_knob' declares no roles"):
        roles.roles_of(Undeclared)
    with pytest.raises(TypeError, match="reads must name every scoped engine"):
        roles.declare(1.0, "a knob", reads={"fast": roles.VALUE}, forward=True, member=False, surface=True,
                      hashed=roles.UNLESS_DEFAULT, tables=roles.DISTINCT)
    with pytest.raises(TypeError, match="declare forward=True"):
        roles.declare(1.0, "a knob", reads=roles.VALUE, forward=False, member=False, surface=True,
                      hashed=roles.UNLESS_DEFAULT, tables=roles.DISTINCT)
    with pytest.raises(TypeError, match="'compred' is not one of"):  # a misspelt selection selects nothing silently
        config.config_fields(tables="compred")
    with pytest.raises(TypeError, match="'sometimes' is not one of"):
        roles.declare(1.0, "a knob", reads=roles.VALUE, forward=True, member=False, surface=True,
                      hashed="sometimes", tables=roles.DISTINCT)


# A scratch field declared in a GeoConfig subclass that stands in for GeoConfig before any consumer is
# imported: each consumer's list and behaviour follows the declaration, with no consumer edited.
SCRATCH = textwrap.dedent('''
    from __future__ import annotations
    import dataclasses, json, sys
    from geolens.model import config, roles

    @dataclasses.dataclass
    class Scratch(config.GeoConfig):
        knob: float = roles.declare(1.0, "a scratch knob", reads={"fast": roles.VALUE, "deep": roles.IGNORED},
                                    forward=True, member=True, surface=False, hashed=roles.UNLESS_DEFAULT,
                                    tables=roles.COMPARED, shown=True, resume=True, sweep_axis="--knobs")

    config.GeoConfig = Scratch
    config.FIELD_ROLES = roles.roles_of(Scratch)

    from geolens.analysis import barrier
    from geolens.model import deep, fast
    from geolens.outputs import tables
    from geolens.runs import runset
    from geolens.sweeps import grid
    from geolens.training import batched, fork, train

    base, other = Scratch(), Scratch(knob=2.0)
    batched.check_members([base, other])  # members may differ in it
    barrier.check_same_surface(base, other)  # not part of the loss surface
    try:
        grid.make_grid(flags={"seeds": "1"}, sets=["knob=3"])
        refused_by_set = None
    except Exception as e:
        refused_by_set = str(e)
    print(json.dumps({
        "fast_value": "knob" in fast.FAST_VALUE_FIELDS, "deep_ignored": "knob" in deep.DEEP_IGNORED_FIELDS,
        "fork_forward": "knob" in fork.FORWARD_FIELDS, "fork_step_evaluated": fork._forward_changed(base, other, 0),
        "member": "knob" in batched.MEMBER_FIELDS, "resume": "knob" in train.RESUMABLE_FIELDS,
        "training": "knob" in barrier.TRAINING_FIELDS, "compared": "knob" in tables.COMPARED,
        "shown": "knob" in runset.SHOWN, "bookkeeping": "knob" in runset.BOOKKEEPING,
        "axis": grid.AXIS_FIELDS.get("knob"), "refused_by_set": refused_by_set,
        "hash_default": base.sha256() == config.GeoConfig.__mro__[1]().sha256(),
        "hash_off_default": other.sha256() != base.sha256(),
        "unless_default": "knob" in config.config_fields(hashed=roles.UNLESS_DEFAULT),
        "help": "a scratch knob" in roles.fields_help(Scratch),
        "group_key_differs": runset.group_key(base) != runset.group_key(other),
        "compared_key_same": runset.group_key(base, ignoring=tables.COMPARED) == runset.group_key(other, ignoring=tables.COMPARED),
    }))
''')


def test_a_new_field_reaches_every_consumer_from_its_declaration():
    out = subprocess.run([sys.executable, "-c", SCRATCH], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {
        "fast_value": True, "deep_ignored": True, "fork_forward": True, "fork_step_evaluated": True, "member": True,
        "resume": True, "training": True, "compared": True, "shown": True, "bookkeeping": False, "axis": "--knobs",
        "refused_by_set": "'knob' is a sweep axis; give it with --knobs instead of --set/[set]",
        "hash_default": True, "hash_off_default": True, "unless_default": True, "help": True,
        "group_key_differs": True, "compared_key_same": True,
    }


def _committed(pattern: str) -> list[Path]:
    files = subprocess.run(["git", "ls-files", pattern], capture_output=True, text=True, cwd=ROOT).stdout.split()
    return [ROOT / f for f in files]


def test_every_committed_identity_hash_is_rebuilt_from_its_record():
    """Every fork record under results/ and checkpoints/ stores its parent's config hash: the parent's config
    (the fork's, with each change undone) hashes to it; and every committed config still loads and hashes."""
    records = _committed("results/**/run.json") + _committed("checkpoints/**/run.json")
    forks = 0
    for path in records:
        header = json.loads(path.read_text())
        cfg = GeoConfig.from_dict(header["config"])
        assert len(cfg.sha256()) == 64
        fork = header.get("fork")
        if fork is None:
            continue
        parent = {**header["config"], **{k: ch["from"] for k, ch in fork["changes"].items()}}
        assert GeoConfig.from_dict(parent).sha256() == fork["parent_identity"]["config_sha256"], path
        forks += 1
    assert len(records) > 100 and forks > 50


def test_every_committed_forecast_key_is_rebuilt_from_its_config():
    """Forecast files key their rules by a configuration (runset.group_key: the fields that are not
    bookkeeping): each stored key is what group_key gives its config, but for the fields added since (hashed
    unless default, at their defaults)."""
    from geolens.runs.runset import group_key

    forecasts = _committed("results/**/forecast.json")
    assert forecasts
    for path in forecasts:
        for entry in json.loads(path.read_text())["forecasts"]:
            stored = json.loads(entry["key"])
            rebuilt = json.loads(group_key(GeoConfig.from_dict(stored)))
            assert {k: rebuilt[k] for k in stored} == stored, (path, entry["configuration"])
            assert set(rebuilt) - set(stored) <= set(config.HASHED_UNLESS_DEFAULT), (path, entry["configuration"])


def test_the_cli_doc_lists_the_fields_the_declaration_generates():
    text = (ROOT / "docs" / "cli.md").read_text()
    assert "<!-- config-fields -->" in text and "| `flush_denormal` |" in text
    assert roles.refresh_field_list(text, GeoConfig) == text, "run `python -m geolens.model.roles docs/cli.md`"


def test_train_help_lists_every_field_with_its_declared_help_and_choices(geolens):
    out = geolens("train", "--help").stdout
    listed = [line.strip() for line in out.splitlines()]
    for line in roles.fields_help(GeoConfig).splitlines():
        assert line in listed, line
    assert "task = 'add' (add, sub, mul, perm, add3): the task: a + b, a - b, a * b mod p, S_n composition, or a + b " \
           "+ c mod p ([a, b, c, =])" in listed  # brackets are text, not rich markup
