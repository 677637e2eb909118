"""Algorithmic tasks: Z_p addition / subtraction / multiplication and S_n composition.

Every example is the token sequence [a, b, =] with `=` = n_classes; the label is a o b.
Splits follow the paper: all n_classes^2 pairs (a-major order) shuffled with Python's
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

    tokens: [N, 3] every (a, b, =) in a-major order (N = n_classes^2); labels: [N];
    train_idx / test_idx: indices into tokens, each in ascending order.
    """

    tokens: Int[Tensor, "N 3"]
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
    """table[a, b] = a o b for the task (for perm: out[i] = a[b[i]], i.e. apply b, then a)."""
    if cfg.task == "perm":
        perms = permutations(cfg.n_perm)
        index = {q: i for i, q in enumerate(perms)}
        return torch.tensor([[index[tuple(pa[i] for i in pb)] for pb in perms] for pa in perms])
    a = torch.arange(cfg.p).unsqueeze(1)
    b = torch.arange(cfg.p).unsqueeze(0)
    if cfg.task == "add":
        return (a + b) % cfg.p
    if cfg.task == "sub":
        return (a - b) % cfg.p
    return (a * b) % cfg.p


def make_dataset(cfg: GeoConfig) -> Dataset:
    """The task's full input grid and its split by cfg.data_seed and cfg.frac_train."""
    n = cfg.n_classes
    table = compose_table(cfg)
    a, b = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    tokens = torch.stack([a.flatten(), b.flatten(), torch.full((n * n,), n)], dim=1)
    labels = table.flatten()
    order = list(range(n * n))
    random.Random(cfg.data_seed).shuffle(order)
    n_train = int(len(order) * cfg.frac_train)
    return Dataset(tokens, labels, torch.tensor(sorted(order[:n_train])), torch.tensor(sorted(order[n_train:])))


# ---- the task's tokens as text --------------------------------------------------------------------
EQUALS = "="
OPERATORS = {"add": "+", "sub": "-", "mul": "*", "perm": "o"}


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


def encode(cfg: GeoConfig, examples) -> Int[Tensor, "batch 3"]:
    """Token ids [batch, 3] ([a, b, =]) of examples given as text or pairs.

    examples: one example or a list of them. An example is a string 'a o b =' (the operator and
    '=' are optional: '17 + 42 =', '17 42'; S_n operands are one-line permutations, '20134 o
    10234 =') or a pair of operand token ids (17, 42). A list of examples gives a batch.
    """
    if isinstance(examples, str) or is_pair(examples):
        examples = [examples]
    if not isinstance(examples, (list, tuple)) or not examples:
        raise GeoError(f"cannot read {examples!r} as examples; pass 'a + b =' strings or (a, b) pairs, or a list of them")
    rows = [_parse(cfg, ex) if isinstance(ex, str) else _pair_ids(cfg, ex) for ex in examples]
    equals = cfg.n_classes
    return torch.tensor([[a, b, equals] for a, b in rows], dtype=torch.long)


def is_pair(x) -> bool:
    """Whether x is one example given as a pair of operand token ids (a, b)."""
    return isinstance(x, (list, tuple)) and len(x) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in x)


def _pair_ids(cfg: GeoConfig, pair) -> tuple[int, int]:
    if not is_pair(pair):
        raise GeoError(f"cannot read {pair!r} as an example; pass an 'a + b =' string or an (a, b) pair of token ids")
    bad = [v for v in pair if not 0 <= v < cfg.n_classes]
    if bad:
        raise GeoError(f"operand token ids {bad} are out of range; task {cfg.task} has operands 0..{cfg.n_classes - 1}")
    return pair[0], pair[1]


def _parse(cfg: GeoConfig, text: str) -> tuple[int, int]:
    words = re.findall(r"\d+|=", text)
    rest = re.sub(r"\d+|=|\s|[-+*/xo\u2218\u00b7]", "", text)
    if words and words[-1] == EQUALS:
        words = words[:-1]
    if rest or len(words) != 2 or EQUALS in words:
        raise GeoError(f"cannot read '{text}' as an example of task {cfg.task}; write two operands and an optional '=', "
                       f"e.g. '{' '.join(token_strings(cfg)[i] for i in (1, 2))} ='")
    ids = [token_id(cfg, w) for w in words]
    if cfg.n_classes in ids:
        raise GeoError(f"'=' cannot be an operand in '{text}'")
    return ids[0], ids[1]


def decode(cfg: GeoConfig, tokens: Tensor) -> list:
    """Text of token ids: a 0-d tensor gives a string, [pos] a list of strings, [batch, pos] a list of lists."""
    strings = token_strings(cfg)
    if tokens.dim() == 0:
        return strings[int(tokens)]
    return [decode(cfg, t) for t in tokens]


def answers(cfg: GeoConfig, tokens: Int[Tensor, "batch 3"], table: Tensor | None = None) -> Int[Tensor, "batch"]:
    """The task's true label a o b of each example [a, b, =]; table: compose_table(cfg) if given."""
    operands = tokens[:, :2] if tokens.dim() == 2 and tokens.shape[1] == cfg.n_ctx else None
    if operands is None or bool(((operands < 0) | (operands >= cfg.n_classes)).any()):
        raise GeoError(f"tokens of shape {tuple(tokens.shape)} are not [batch, 3] examples [a, b, =] of task {cfg.task}; "
                       f"pass labels= explicitly")
    table = (compose_table(cfg) if table is None else table).to(tokens.device)
    return table[operands[:, 0], operands[:, 1]]
