"""The roles of a config field, declared once where the field is defined (`declare`) and read by every module
that treats fields differently (`roles_of`, `select`), so adding a field means declaring it in one place.

A role says what the rest of geolens does with the field:

    help, choices   what the field means and its allowed values (`geolens train --help`, docs/cli.md)
    reads           per engine with a declared scope (ENGINE_SCOPES): 'choice' (the forward branches on the
                    value; the engine lists the values it computes), 'value' (read as a number, any valid value
                    computes exactly) or 'ignored' (no part of that engine's forward)
    forward         a change alters what the model computes at a given step (the forward, or the weights it runs
                    on): a fork that switches it evaluates its first row anew
    fork_refused    why a fork cannot change it ('' when a fork may)
    member          members of one stacked (batched) run may differ in it
    surface         it defines the loss surface (the model and the data split): two checkpoints compared on one
                    surface (barriers) must agree in it
    hashed          'always' in the identity hash (GeoConfig.sha256), or 'unless default': fields added after
                    identities were first recorded are hashed only off their default, so recorded identities
                    (a fork's parent_identity) stay valid, or 'never' (how a run is stored, not what it
                    computes: the storage policy). A new field is 'unless default'.
    tables          'bookkeeping' (runs that differ only in it are one configuration of the tables), 'compared'
                    (a configuration of its own, and an onset row may differ from its LayerNorm baseline in it)
                    or 'distinct' (a configuration of its own, compared with nothing that differs in it)
    shown           a group's name and the tables' columns show it (the other non-default fields are "extras")
    resume          `--resume` may change it
    sweep_axis      the `geolens sweep` flag that gives it per member ('' none; `--set` then refuses the field)
    grid_key        the sweep's grid-file key (and flag) that gives it to every member ('' none)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

ENGINE_SCOPES = ("fast", "deep")  # the engines that declare a scope (geolens.model.engines; hooked runs any config)
CHOICE, VALUE, IGNORED = "choice", "value", "ignored"
ALWAYS, UNLESS_DEFAULT, NEVER = "always", "unless default", "never"
BOOKKEEPING, COMPARED, DISTINCT = "bookkeeping", "compared", "distinct"
_KINDS = {"reads": (CHOICE, VALUE, IGNORED), "hashed": (ALWAYS, UNLESS_DEFAULT, NEVER),
          "tables": (BOOKKEEPING, COMPARED, DISTINCT)}


@dataclass(frozen=True)
class Roles:
    """One field's roles (the module docstring says what each means)."""

    help: str
    reads: Mapping[str, str]
    forward: bool
    member: bool
    surface: bool
    hashed: str
    tables: str
    choices: tuple[str, ...] = ()
    fork_refused: str = ""
    shown: bool = False
    resume: bool = False
    sweep_axis: str = ""
    grid_key: str = ""

    def __post_init__(self) -> None:
        if not self.help:
            raise TypeError("a field's roles need a help text")
        if set(self.reads) != set(ENGINE_SCOPES):
            raise TypeError(f"reads must name every scoped engine {ENGINE_SCOPES}, not {sorted(self.reads)}")
        for name, kinds in _KINDS.items():
            values = self.reads.values() if name == "reads" else (getattr(self, name),)
            bad = [v for v in values if v not in kinds]
            if bad:
                raise TypeError(f"{name} = {bad[0]!r} is not one of {kinds}")
        if not self.forward and any(kind != IGNORED for kind in self.reads.values()):
            raise TypeError("a field an engine reads changes the forward: declare forward=True")

    def matches(self, criteria: Mapping[str, Any]) -> bool:
        """Whether every criterion holds: a role name (or an engine of ENGINE_SCOPES, for its reads) -> value."""
        return all((self.reads[k] if k in ENGINE_SCOPES else getattr(self, k)) == v for k, v in criteria.items())


def declare(default: Any, help: str, *, reads: str | Mapping[str, str], forward: bool, member: bool, surface: bool,
            hashed: str, tables: str, **optional: Any) -> Any:
    """A dataclass field with default `default` and its Roles (reads: one kind for every scoped engine, or
    {engine: kind}; optional: the roles with defaults, e.g. choices=TASKS, resume=True)."""
    per_engine = dict.fromkeys(ENGINE_SCOPES, reads) if isinstance(reads, str) else dict(reads)
    roles = Roles(help, per_engine, forward, member, surface, hashed, tables, **optional)
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata={"roles": roles})
    return dataclasses.field(default=default, metadata={"roles": roles})


def roles_of(cls: type) -> dict[str, Roles]:
    """{field name: Roles} of a dataclass, in declaration order; a TypeError names a field that declares none."""
    out = {}
    for f in dataclasses.fields(cls):
        if not isinstance(f.metadata.get("roles"), Roles):
            raise TypeError(f"{cls.__name__} field '{f.name}' declares no roles; define it with "
                            "geolens.model.roles.declare(default, help, reads=..., ...)")
        out[f.name] = f.metadata["roles"]
    return out


def select(cls: type, **criteria: Any) -> tuple[str, ...]:
    """The fields of dataclass `cls` whose roles meet every criterion, in declaration order:
    select(GeoConfig, member=True), select(GeoConfig, fast=VALUE)."""
    for name, value in criteria.items():
        kinds = _KINDS["reads"] if name in ENGINE_SCOPES else _KINDS.get(name)
        if kinds is not None and value not in kinds:
            raise TypeError(f"{name} = {value!r} is not one of {kinds}")
    return tuple(name for name, roles in roles_of(cls).items() if roles.matches(criteria))


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value (a fresh one for a default_factory)."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


# ---- the field list of `geolens train --help` and docs/cli.md --------------------------------------------
def _allowed(f: dataclasses.Field, roles: Roles) -> str:
    return ", ".join(roles.choices) if roles.choices else str(f.type)


def _role_words(roles: Roles) -> str:
    """The roles a user acts on, in words: what a fork, a resume, a stacked sweep and the tables do with it."""
    words = []
    if roles.fork_refused:
        words.append("fork: refused")
    elif roles.forward:
        words.append("fork: re-evaluated")
    if roles.resume:
        words.append("resume may change")
    if roles.member:
        words.append("per member")
    if roles.sweep_axis:
        words.append(f"sweep {roles.sweep_axis}")
    if roles.tables == BOOKKEEPING:
        words.append("bookkeeping")
    return ", ".join(words)


def fields_help(cls: type) -> str:
    """One line per field for `geolens train --help`: 'name = default (allowed): help'."""
    return "\n".join(f"{f.name} = {default_of(f)!r} ({_allowed(f, r)}): {r.help}"
                       for f, r in zip(dataclasses.fields(cls), roles_of(cls).values()))


def fields_markdown(cls: type) -> str:
    """The markdown table of docs/cli.md's field list (between its `<!-- config-fields -->` markers)."""
    rows = ["| field | default | allowed | meaning | roles |", "| --- | --- | --- | --- | --- |"]
    for f, r in zip(dataclasses.fields(cls), roles_of(cls).values()):
        cells = (f"`{f.name}`", f"`{default_of(f)!r}`", _allowed(f, r), r.help, _role_words(r))
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def refresh_field_list(text: str, cls: type) -> str:
    """`text` (docs/cli.md) with the block between `<!-- config-fields -->` and `<!-- /config-fields -->`
    replaced by fields_markdown(cls)."""
    begin, end = "<!-- config-fields -->\n", "\n<!-- /config-fields -->"
    if begin not in text or end not in text:
        raise SystemExit(f"no {begin.strip()} ... {end.strip()} block to refresh")
    return text[: text.index(begin) + len(begin)] + fields_markdown(cls) + text[text.index(end):]


if __name__ == "__main__":  # python -m geolens.model.roles docs/cli.md: rewrite its field list
    import sys
    from pathlib import Path

    from geolens.model import roles as declared  # the module the config declares with (this one runs as __main__)
    from geolens.model.config import GeoConfig

    doc = Path(sys.argv[1])
    doc.write_text(declared.refresh_field_list(doc.read_text(), GeoConfig))
