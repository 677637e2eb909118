"""Each TransformerLens habit on each GeoTransformer topology: exact, or refused with its message.

Every habit runs on a small two-layer model (p = 7, d_model 16, float64, every weight, gain and offset
moved off its initial value by a seeded draw) of each topology: placement post / pre, norm layernorm /
rmsnorm / none / sphere, readout raw / bounded, learned attention (and one uniform-attention model).
"exact" means equal to the model's own logits (or activations) to 1e-9, or 1e-5 where TransformerLens
computes in float32 (its RMSNorm, patching's result store). The table goes to results/transformerlens/habits.md (the refusals' messages to
habit_refusals.md), both embedded in docs/model.md; tests/test_transformerlens.py recomputes every row and checks the committed table.

    python analyses/transformerlens/habits.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from geolens.errors import GeoError
from geolens.model import tasks
from geolens.model.config import make_config
from geolens.model.transformer import GeoTransformer
from geolens.runs.storage import atomic_write_bytes

ROOT = Path(__file__).resolve().parent.parent.parent
TABLE = ROOT / "results" / "transformerlens" / "habits.md"
NOTES = ROOT / "results" / "transformerlens" / "habit_refusals.md"
SMALL = dict(p=7, d_model=16, n_heads=2, d_head=4, d_mlp=16, n_layers=2, frac_train=0.5, seed=3)
TOPOLOGIES = [(placement, norm, readout, "learned") for placement in ("post", "pre")
              for norm in ("layernorm", "rmsnorm", "none", "sphere") for readout in ("raw", "bounded")]
TOPOLOGIES.append(("pre", "layernorm", "raw", "uniform"))
EXACT, TL_FLOAT32 = 1e-9, 1e-5


def topology_name(topology: tuple[str, str, str, str]) -> str:
    placement, norm, readout, attention = topology
    return f"{placement} {norm} {readout}" + ("" if attention == "learned" else f" {attention}")


def make_model(topology) -> GeoTransformer:
    """The topology's model with every parameter moved off its initialisation (a seeded draw), float64, eval."""
    placement, norm, readout, attention = topology
    model = GeoTransformer(make_config("ln", norm=norm, norm_placement=placement, unembed=readout,
                                       attention=attention, **SMALL)).double().eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def close(a: torch.Tensor, b: torch.Tensor, tol: float = EXACT) -> bool:
    return bool((a - b).abs().max() <= tol * max(1.0, b.abs().max().item()))


def _inputs(model):
    tokens = tasks.encode(model.cfg, [(a, b) for a in range(model.cfg.p) for b in range(model.cfg.p)])
    return tokens, tasks.answers(model.cfg, tokens, tasks.compose_table(model.cfg))


def _final_stream(model, cache):
    resid = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    return model.ln_final(resid) if model.pre_norm else resid


def logit_lens(model):
    tokens, _ = _inputs(model)
    logits, cache = model.run_with_cache(tokens)
    return "exact" if close(_final_stream(model, cache) @ model.W_U + model.b_U, logits) else "differs"


def raw_parameter_lens(model):
    tokens, _ = _inputs(model)
    logits, cache = model.run_with_cache(tokens)
    if close(_final_stream(model, cache) @ model.unembed.W_U + model.b_U, logits):
        return "exact"
    return "differs: the trained parameter, not the readout (use model.W_U)"


def normalization_type(model):
    return f"{model.cfg.normalization_type!r} ({model.cfg.norm_placement})"


def pre_norm_modules(model):
    model.ln_final, model.blocks[0].ln1  # noqa: B018 (the habit is the attribute access)
    return "present"


def apply_ln_and_logit_attrs(model):
    """The sum over decompose_resid's parts of logit_attrs (which applies apply_ln_to_stack in
    TransformerLens 4) against the answer logit."""
    tokens, answers = _inputs(model)
    logits, cache = model.run_with_cache(tokens)
    attrs = cache.logit_attrs(cache.decompose_resid(layer=None, pos_slice=-1), tokens=answers, pos_slice=-1).sum(0)
    target = logits[:, -1].gather(1, answers[:, None])[:, 0] - model.b_U[answers]
    if close(attrs, target):
        return "exact"
    offset = (model.ln_final.b @ model.W_U)[answers] if model.pre_norm and hasattr(model.ln_final, "b") else None
    if offset is not None and close(attrs + offset, target):
        return "exact up to ln_final's offset b @ W_U"
    return "differs"


def biases(model):
    cfg = model.cfg
    L, H, Dh, D, C = cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.d_model, cfg.d_vocab_out
    shapes = {"b_Q": (L, H, Dh), "b_K": (L, H, Dh), "b_V": (L, H, Dh), "b_O": (L, D), "b_U": (C,)}
    per_block = {"b_Q": (H, Dh), "b_K": (H, Dh), "b_V": (H, Dh), "b_O": (D,)}
    ok = all(tuple(getattr(model, n).shape) == s and not getattr(model, n).any() for n, s in shapes.items())
    ok &= all(tuple(getattr(model.blocks[0].attn, n).shape) == s for n, s in per_block.items())
    return "zeros, HookedTransformer's shapes" if ok else "differs"


def attn_result(model):
    tokens, _ = _inputs(model)
    model.set_use_attn_result(True)
    _, cache = model.run_with_cache(tokens)
    ok = all(close(cache[f"blocks.{L}.attn.hook_result"].sum(-2) + model.blocks[L].attn.b_O,
                   cache[f"blocks.{L}.hook_attn_out"]) for L in range(model.cfg.n_layers))
    return "exact" if ok else "differs"


def _keeps_logits(model, change, softmax: bool = False) -> str:
    tokens, _ = _inputs(model)
    before = model(tokens)
    change(model)
    after = model(tokens)
    if softmax:
        before, after = before.log_softmax(-1), after.log_softmax(-1)
    return ("exact" if close(after, before) else "differs") + (f", normalization_type {model.cfg.normalization_type!r}"
                                                                 if change is GeoTransformer.fold_layer_norm else "")


def fold_layer_norm(model):
    return _keeps_logits(model, GeoTransformer.fold_layer_norm)


def center_writing_weights(model):
    return _keeps_logits(model, GeoTransformer.center_writing_weights)


def center_unembed(model):
    return _keeps_logits(model, GeoTransformer.center_unembed, softmax=True).replace("exact", "softmax exact")


def bridge(model):
    tokens, _ = _inputs(model)
    tl = model.to_transformer_bridge()
    logits, cache = tl.run_with_cache(tokens)
    names = {f"blocks.{L}.{h}" for L in range(model.cfg.n_layers) for h in ("hook_resid_pre", "attn.hook_z",
                                                                             "mlp.hook_post", "hook_resid_post")}
    same = close(logits, model(tokens), TL_FLOAT32) and names <= set(cache.keys())
    return "exact, TransformerLens's hook names" if same else "differs"


def activation_patching(model):
    """transformer_lens.patching on a clean / corrupted pair that differ in b: patching the clean resid_pre
    of layer 0 at position 1 restores the clean answer's logit."""
    from transformer_lens import patching

    clean, corrupted = model.to_tokens([(1, 2)]), model.to_tokens([(1, 5)])
    answer = int(tasks.answers(model.cfg, clean, tasks.compose_table(model.cfg))[0])
    _, clean_cache = model.run_with_cache(clean)
    patched = patching.get_act_patch_resid_pre(model, corrupted, clean_cache, lambda logits: logits[0, -1, answer])
    return "exact" if close(patched[0, 1], model(clean)[0, -1, answer], TL_FLOAT32) else "differs"  # a float32 store


HABITS = {
    "logit lens `final @ model.W_U + model.b_U`": logit_lens,
    "`final @ model.unembed.W_U`": raw_parameter_lens,
    "`cfg.normalization_type` (`norm_placement`)": normalization_type,
    "`model.ln_final`, `blocks[0].ln1`": pre_norm_modules,
    "`logit_attrs(decompose_resid())` (applies `apply_ln_to_stack`)": apply_ln_and_logit_attrs,
    "`b_Q b_K b_V b_O b_U`": biases,
    "`set_use_attn_result`: sum of `hook_result`": attn_result,
    "`fold_layer_norm()`": fold_layer_norm,
    "`center_writing_weights()`": center_writing_weights,
    "`center_unembed()`": center_unembed,
    "`to_transformer_bridge()`": bridge,
    "`transformer_lens.patching`": activation_patching,
}


def outcome(habit, topology) -> str:
    """The habit on a fresh model of the topology: its result, or 'refused: <the one-line message>'."""
    try:
        return habit(make_model(topology))
    except GeoError as e:
        return f"refused: {e}"


def row(topology) -> dict[str, str]:
    return {name: outcome(habit, topology) for name, habit in HABITS.items()}


def render(rows: dict[str, dict[str, str]]) -> tuple[str, str]:
    """Two Markdown tables: one row per topology and one column per habit, refusals as [n]; then each
    refusal's message by its [n]."""
    messages: list[str] = []

    def cell(text: str) -> str:
        if not text.startswith("refused: "):
            return text
        if text not in messages:
            messages.append(text)
        return f"refused [{messages.index(text) + 1}]"

    lines = ["| topology | " + " | ".join(HABITS) + " |", "| --- " * (len(HABITS) + 1) + "|"]
    for name, cells in rows.items():
        lines.append(f"| {name} | " + " | ".join(cell(cells[h]) for h in HABITS) + " |")
    notes = ["| refusal | message |", "| --- | --- |"]
    notes += [f"| [{i}] | {m.removeprefix('refused: ')} |" for i, m in enumerate(messages, 1)]
    return "\n".join(lines) + "\n", "\n".join(notes) + "\n"


def parse(table: str, notes: str) -> dict[str, dict[str, str]]:
    """render's inverse: topology name -> habit -> outcome (refusals with their full message)."""
    messages = {}
    for line in notes.splitlines()[2:]:
        key, message = line.strip("| ").split(" | ", 1)
        messages[key] = "refused: " + message
    rows = {}
    for line in table.splitlines()[2:]:
        name, *cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows[name] = {h: messages.get(c.removeprefix("refused "), c) for h, c in zip(HABITS, cells)}
    return rows


def committed() -> dict[str, dict[str, str]]:
    """The committed table, parsed."""
    return parse(TABLE.read_text(), NOTES.read_text())


def main() -> None:
    rows = {topology_name(t): row(t) for t in TOPOLOGIES}
    table, notes = render(rows)
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(TABLE, table.encode())
    atomic_write_bytes(NOTES, notes.encode())
    print(f"wrote {TABLE.relative_to(ROOT)} and {NOTES.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
