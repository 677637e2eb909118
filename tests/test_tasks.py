"""Tasks and seeded splits."""

import itertools

import pytest
import torch

from geolens.errors import GeoError
from geolens.model.config import GeoConfig, make_config
from geolens.model.tasks import compose_table, make_dataset, permutations


def test_paper_split_sizes_z113():
    data = make_dataset(make_config("fb", p=113, frac_train=0.3, data_seed=1))
    assert (len(data.train_idx), len(data.test_idx)) == (3830, 8939)
    assert torch.equal(torch.sort(torch.cat([data.train_idx, data.test_idx])).values, torch.arange(113 * 113))


def test_paper_split_sizes_s5():
    cfg = make_config("ln", task="perm", n_perm=5, frac_train=0.3)
    data = make_dataset(cfg)
    assert (cfg.d_vocab, cfg.d_vocab_out) == (121, 120)
    assert (len(data.train_idx), len(data.test_idx)) == (4320, 10080)
    assert (data.tokens[:, 2] == 120).all()


def test_split_follows_the_data_seed_only():
    base = make_config("fb", p=23, data_seed=4, seed=0)
    a = make_dataset(base).train_idx
    assert torch.equal(a, make_dataset(base.replace(seed=9)).train_idx)  # init seed is separate
    assert not torch.equal(a, make_dataset(base.replace(data_seed=5)).train_idx)


def test_split_is_python_random_shuffle_of_a_major_pairs():
    import random

    cfg = make_config("fb", p=23, data_seed=7, frac_train=0.5)
    order = list(range(23 * 23))
    random.Random(7).shuffle(order)
    data = make_dataset(cfg)
    assert data.train_idx.tolist() == sorted(order[: int(0.5 * 23 * 23)])  # the same set, stored ascending
    assert data.test_idx.tolist() == sorted(order[int(0.5 * 23 * 23) :])
    a, b = divmod(order[0], 23)
    assert data.tokens[order[0]].tolist() == [a, b, 23]


@pytest.mark.parametrize("task,op", [("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b)])
def test_zp_labels(task, op):
    cfg = make_config("ln", task=task, p=29)
    data = make_dataset(cfg)
    a, b = data.tokens[:, 0], data.tokens[:, 1]
    assert torch.equal(data.labels, op(a, b) % 29)


def test_permutation_composition_applies_b_then_a():
    perms = permutations(5)
    assert perms == list(itertools.permutations(range(5)))
    table = compose_table(make_config("ln", task="perm", n_perm=5))
    for ia, ib in [(1, 2), (17, 99), (119, 5)]:
        a, b = perms[ia], perms[ib]
        assert perms[table[ia, ib]] == tuple(a[b[i]] for i in range(5))
    assert not torch.equal(table, table.T)  # S5 is not commutative


def test_p_must_be_prime_for_zp_tasks():
    with pytest.raises(GeoError, match="not prime"):
        GeoConfig(p=100)
    GeoConfig(task="perm", p=100)  # p is irrelevant for S_n


@pytest.mark.parametrize("bad", [dict(task="div"), dict(n_perm=7, task="perm"), dict(frac_train=1.0), dict(norm="batch")])
def test_bad_config_values_are_named(bad):
    with pytest.raises(GeoError, match=next(iter(bad))):
        GeoConfig(**bad)


def test_presets_and_modifiers():
    cfg = make_config("fb+uniform+fourier")
    assert (cfg.norm, cfg.unembed, cfg.weight_decay, cfg.attention) == ("sphere", "bounded", 0.0, "uniform")
    assert cfg.fourier_init == [14, 35, 41, 42, 52]
    assert make_config("sphere").weight_decay == 1.0 and make_config("sphere_raw").unembed == "raw"
    with pytest.raises(GeoError, match="unknown preset 'foo'"):
        make_config("foo")
    with pytest.raises(GeoError, match=r"\+bar"):
        make_config("ln+bar")


def test_config_json_round_trip():
    cfg = make_config("rms+uniform", p=31, lr=1e-3, early_stop_after=100)
    assert GeoConfig.from_dict(__import__("json").loads(cfg.to_json())) == cfg


def test_task_label_names_the_task_and_its_size():
    assert make_config("fb", task="add", p=113).task_label == "add p=113"
    assert make_config("ln", task="perm", n_perm=5).task_label == "perm S5"  # no modulus for S_n
