"""Algorithmic tasks: Z_p addition / subtraction / multiplication, S_n composition, Z_p sums of 3 operands.

Every example is the token sequence [a, b, =] with `=` = n_classes; the label is a o b (task add3:
[a, b, c, =], label (a + b + c) mod p). Splits follow the paper: all n_classes^n_operands inputs
(a-major order) shuffled with Python's
random.Random(data_seed), the first int(frac_train * N) are the training set. Each split's indices
are then stored in ascending (a-major) order: full-batch training does not depend on the order of
the examples, and neighbouring examples sharing a token make the fast path's per-token table reads
cache-friendly (docs/performance.md).
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from geolens.errors import GeoError
from geolens.model.config import GeoConfig


@dataclass(frozen=True)
class Dataset:
    """All inputs of a task plus its seeded split.

    tokens: [N, n_ctx] every (a, b, =) (add3: (a, b, c, =)) in a-major order (N = cfg.n_inputs); labels: [N];
    train_idx / test_idx: indices into tokens, each in ascending order.
    """

    tokens: Int[Tensor, "N n_ctx"]
    labels: Int[Tensor, "N"]
    train_idx: Int[Tensor, "n_train"]
    test_idx: Int[Tensor, "n_test"]

    @property
    def train(self) -> tuple[Tensor, Tensor]:
        return self.tokens[self.train_idx], self.labels[self.train_idx]

    @property
    def test(self) -> tuple[Tensor, Tensor]:
        return self.tokens[self.test_idx], self.labels[self.test_idx]


def permutations(n: int) -> list[tuple[int, ...]]:
    """The n! permutations of range(n) in itertools order; the list index is the token id."""
    return list(itertools.permutations(range(n)))


def compose_table(cfg: GeoConfig) -> Int[Tensor, "n_classes n_classes"]:
    """table[a, b] = a o b for the task (for perm: out[i] = a[b[i]], i.e. apply b, then a; add3: a + b mod p,
    applied twice)."""
    if cfg.task == "perm":
        perms = permutations(cfg.n_perm)
        index = {q: i for i, q in enumerate(perms)}
        return torch.tensor([[index[tuple(pa[i] for i in pb)] for pb in perms] for pa in perms])
    a = torch.arange(cfg.p).unsqueeze(1)
    b = torch.arange(cfg.p).unsqueeze(0)
    if cfg.task in ("add", "add3"):
        return (a + b) % cfg.p
    if cfg.task == "sub":
        return (a - b) % cfg.p
    return (a * b) % cfg.p


def make_dataset(cfg: GeoConfig) -> Dataset:
    """The task's full input grid and its split by cfg.data_seed and cfg.frac_train."""
    n, N = cfg.n_classes, cfg.n_inputs
    grids = torch.meshgrid(*[torch.arange(n)] * cfg.n_operands, indexing="ij")
    tokens = torch.stack([g.flatten() for g in grids] + [torch.full((N,), n)], dim=1)
    labels = answers(cfg, tokens)
    order = list(range(N))
    random.Random(cfg.data_seed).shuffle(order)
    n_train = int(len(order) * cfg.frac_train)
    return Dataset(tokens, labels, torch.tensor(sorted(order[:n_train])), torch.tensor(sorted(order[n_train:])))


# ---- the task's tokens as text --------------------------------------------------------------------
EQUALS = "="


def token_strings(cfg: GeoConfig) -> list[str]:
    """The input vocabulary as text, indexed by token id: the classes ('0' .. 'p-1' for Z_p tasks;
    one-line permutations such as '20134' for S_n, token id = index in `permutations`), then '='."""
    if cfg.task == "perm":
        classes = ["".join(map(str, q)) for q in permutations(cfg.n_perm)]
    else:
        classes = [str(i) for i in range(cfg.p)]
    return classes + [EQUALS]


def token_id(cfg: GeoConfig, text: str) -> int:
    """Token id of one token's text ('17', '=', or an S_n permutation such as '20134')."""
    ids = _token_ids(cfg)
    if text.strip() not in ids:
        kind = f"a permutation of 0..{cfg.n_perm - 1} in one-line notation (e.g. '{token_strings(cfg)[1]}')" \
            if cfg.task == "perm" else f"an integer in 0..{cfg.p - 1}"
        raise GeoError(f"'{text}' is not a token of task {cfg.task}; use {kind} or '='")
    return ids[text.strip()]


def _token_ids(cfg: GeoConfig) -> dict[str, int]:
    return {s: i for i, s in enumerate(token_strings(cfg))}


def encode(cfg: GeoConfig, examples) -> Int[Tensor, "batch n_ctx"]:
    """Token ids [batch, n_ctx] ([a, b, =]; add3 [a, b, c, =]) of examples given as text or tuples.

    examples: one example or a list of them. An example is a string 'a o b =' (the operator and
    '=' are optional: '17 + 42 =', '17 42'; S_n operands are one-line permutations, '20134 o
    10234 =') or a pair of operand token ids (17, 42); add3 takes three ('1 + 2 + 3 =', (1, 2, 3)). A list of
    examples gives a batch.
    """
    if isinstance(examples, str) or is_pair(examples, cfg.n_operands):
        examples = [examples]
    if not isinstance(examples, (list, tuple)) or not examples:
        raise GeoError(f"cannot read {examples!r} as examples; pass 'a + b =' strings or (a, b) pairs, or a list of them")
    rows = [_parse(cfg, ex) if isinstance(ex, str) else _pair_ids(cfg, ex) for ex in examples]
    equals = cfg.n_classes
    return torch.tensor([[*operands, equals] for operands in rows], dtype=torch.long)


def is_pair(x, n_operands: int = 2) -> bool:
    """Whether x is one example given as a tuple of n_operands operand token ids ((a, b); add3 (a, b, c))."""
    return isinstance(x, (list, tuple)) and len(x) == n_operands and \
        all(isinstance(v, int) and not isinstance(v, bool) for v in x)


def _pair_ids(cfg: GeoConfig, pair) -> tuple[int, ...]:
    if not is_pair(pair, cfg.n_operands):
        raise GeoError(f"cannot read {pair!r} as an example; pass an '{_example_text(cfg)}' string or a tuple of "
                       f"{cfg.n_operands} operand token ids")
    bad = [v for v in pair if not 0 <= v < cfg.n_classes]
    if bad:
        raise GeoError(f"operand token ids {bad} are out of range; task {cfg.task} has operands 0..{cfg.n_classes - 1}")
    return tuple(pair)


def _example_text(cfg: GeoConfig) -> str:
    return " + ".join("abc"[: cfg.n_operands]) + " ="


def _parse(cfg: GeoConfig, text: str) -> tuple[int, ...]:
    words = re.findall(r"\d+|=", text)
    rest = re.sub(r"\d+|=|\s|[-+*/xo\u2218\u00b7]", "", text)
    if words and words[-1] == EQUALS:
        words = words[:-1]
    k = cfg.n_operands
    if rest or len(words) != k or EQUALS in words:
        raise GeoError(f"cannot read '{text}' as an example of task {cfg.task}; write {k} operands and an optional "
                       f"'=', e.g. '{' '.join(token_strings(cfg)[i] for i in range(1, k + 1))} ='")
    ids = [token_id(cfg, w) for w in words]
    if cfg.n_classes in ids:
        raise GeoError(f"'=' cannot be an operand in '{text}'")
    return tuple(ids)


def decode(cfg: GeoConfig, tokens: Tensor) -> list:
    """Text of token ids: a 0-d tensor gives a string, [pos] a list of strings, [batch, pos] a list of lists."""
    strings = token_strings(cfg)
    if tokens.dim() == 0:
        return strings[int(tokens)]
    return [decode(cfg, t) for t in tokens]


def answers(cfg: GeoConfig, tokens: Int[Tensor, "batch n_ctx"], table: Tensor | None = None) -> Int[Tensor, "batch"]:
    """The task's true label of each example: a o b of [a, b, =] (add3: (a + b + c) mod p of [a, b, c, =]);
    table: compose_table(cfg) if given."""
    k = cfg.n_operands
    operands = tokens[:, :k] if tokens.dim() == 2 and tokens.shape[1] == cfg.n_ctx else None
    if operands is None or bool(((operands < 0) | (operands >= cfg.n_classes)).any()):
        raise GeoError(f"tokens of shape {tuple(tokens.shape)} are not [batch, {cfg.n_ctx}] examples of task {cfg.task}; "
                       f"pass labels= explicitly")
    table = (compose_table(cfg) if table is None else table).to(tokens.device)
    out = table[operands[:, 0], operands[:, 1]]
    for j in range(2, k):
        out = table[out, operands[:, j]]
    return out
