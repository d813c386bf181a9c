"""The registry of model-level membership attacks (privaudit/eval/membership_attacks.py): the
built-ins are registrations like any other, the reference-run count is checked in one place,
a plugin file — the one docs/extending.md shows — adds attacks that run through the API and
the CLI, and a broken one is one line naming it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli, tiny

from privaudit.api.model_membership import Candidates, model_mia, reference_shards
from privaudit.core.errors import NameTaken, PrivauditError
from privaudit.core.extensions import ExtensionFailed
from privaudit.eval import membership_scoring as M
from privaudit.eval.membership_attacks import (
    MEMBERSHIP_ATTACKS,
    PAIRED,
    Evidence,
    ReferenceRuns,
    check_references,
    declared,
    register_membership_attack,
    score_all,
)
from privaudit.plugins import load_plugins
from privaudit.sim.run import Run

pytestmark = pytest.mark.usefixtures("registries")

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def doc_plugin() -> str:
    """The plugin file of docs/extending.md's membership-attack section (its python block)."""
    text = DOC.read_text()
    section = text[text.index("## The membership attack contract") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def plugin(tmp_path) -> Path:
    path = tmp_path / "membership_plugin_from_the_docs.py"
    path.write_text(doc_plugin())
    return path


def evidence(k: int | None, n: int = 6, classes: int = 3, z: int = 5, seed: int = 0) -> Evidence:
    """Random logits for n candidates and z population examples; k reference models (in
    complementary pairs, as the reference runs draw them) or none."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n + z, classes, generator=g, dtype=torch.float64)
    labels = torch.randint(classes, (n + z,), generator=g)
    seen = dict(
        logits=logits[:n],
        labels=labels[:n],
        population_logits=logits[n:],
        population_labels=labels[n:],
    )
    if k is None:
        return Evidence(**seen)
    refs = torch.randn(k, n + z, classes, generator=g, dtype=torch.float64)
    inside = np.zeros((n, k), bool)
    inside[: n // 2, 0::2] = True
    inside[n // 2 :, 1::2] = True
    return Evidence(
        **seen,
        reference_logits=refs[:, :n],
        reference_population_logits=refs[:, n:],
        inside=inside,
    )


# -- the registry ------------------------------------------------------------------------------
def test_the_built_ins_are_registrations_in_order():
    assert list(MEMBERSHIP_ATTACKS)[:3] == ["loss", "lira", "rmia"]
    assert declared("loss").references is None and declared("loss").headline == "loss"
    assert declared("lira").references == PAIRED and declared("lira").headline == "lira-online"
    assert declared("rmia").references == PAIRED and declared("rmia").headline == "rmia"
    with pytest.raises(PrivauditError, match=r"--attack must be grad or one of loss, lira, rmia"):
        declared("magic")


def test_scores_are_the_attacks_whose_needs_are_met():
    """Without reference models only LOSS scores; with them every built-in does, in order, and
    each score is the math of privaudit.eval.membership_scoring on the evidence."""
    ev = evidence(None)
    assert list(score_all(ev)) == ["loss"]
    ev = evidence(4)
    got = score_all(ev)
    assert list(got) == ["loss", "lira-online", "lira-offline", "rmia"]
    ce = torch.nn.functional.cross_entropy(ev.logits, ev.labels, reduction="none")
    np.testing.assert_array_equal(got["loss"], -ce.numpy())
    assert ev.reference_losses().shape == (6, 4)
    torch.testing.assert_close(
        ev.reference_losses()[:, 1],
        torch.nn.functional.cross_entropy(ev.reference_logits[1], ev.labels, reduction="none"),
    )
    phi = np.stack([M.logit_confidence(ev.reference_logits[c], ev.labels) for c in range(4)], 1)
    offline = M.lira_offline(
        M.logit_confidence(ev.logits, ev.labels),
        np.where(ev.inside, np.nan, phi),
        global_variance=True,
    )
    np.testing.assert_array_equal(got["lira-offline"], offline)


def test_the_even_count_is_checked_in_one_place():
    """One rule, one line: the attack's declared need and the reference runs' draw refuse an
    odd or too small K with the same words; an attack without reference runs takes any K."""
    for k in (0, 1, 3, 7):
        with pytest.raises(PrivauditError) as declared_need:
            check_references("lira", k)
        with pytest.raises(PrivauditError) as drawn:
            reference_shards(Candidates(*[torch.arange(4)] * 4, n_train=4), k, seed=0)
        assert str(declared_need.value) == str(drawn.value)
        assert "even number ≥ 2" in str(drawn.value) and "--references 8" in str(drawn.value)
    check_references("lira", 2)
    check_references("loss", 3)
    with pytest.raises(PrivauditError, match="even number ≥ 6, e.g. --references 8"):
        ReferenceRuns(least=6).check(4)
    assert ReferenceRuns(least=6).met(6) and not ReferenceRuns(least=6).met(7)


def test_registration_is_refused_with_one_line():
    with pytest.raises(NameTaken):
        register_membership_attack("lira", lambda evidence: {})
    for fn, problem in (
        (type("Score", (), {}), "not a function"),
        (lambda: {}, "no positional argument"),
        (lambda evidence, scale: {}, "requires scale"),
    ):
        with pytest.raises(PrivauditError, match=problem) as e:
            register_membership_attack("mine", fn)
        assert "fix: define it as def score(evidence)" in str(e.value)
    with pytest.raises(PrivauditError, match="declares references=2"):
        register_membership_attack("mine", lambda evidence: {}, references=2)
    assert "mine" not in MEMBERSHIP_ATTACKS


def test_a_bad_answer_is_one_line_naming_the_attack():
    """A score of the wrong length, a NaN, a name another attack gives, or an exception."""
    answers = {
        "short": lambda ev: {"short": np.zeros(2)},
        "nan": lambda ev: np.full(len(ev.labels), np.nan),
        "clash": lambda ev: {"loss": np.zeros(len(ev.labels))},
        "raises": lambda ev: 1 / 0,
    }
    for name, fn in answers.items():
        register_membership_attack(name, fn)
        with pytest.raises(ExtensionFailed, match=f"membership attack '{name}'") as e:
            score_all(evidence(None))
        assert e.value.hook == "score function"
        del MEMBERSHIP_ATTACKS[name]
    register_membership_attack("bare", lambda ev: torch.zeros(len(ev.labels)))
    assert list(score_all(evidence(None))) == ["loss", "bare"]  # a bare array: its own name


# -- a plugin file -------------------------------------------------------------------------------
def test_the_documented_plugin_registers_and_scores(plugin):
    load_plugins([plugin])
    assert list(MEMBERSHIP_ATTACKS)[-2:] == ["negative-loss-squared", "calibrated-loss"]
    assert declared("calibrated-loss").references == PAIRED
    ev = evidence(2)
    got = score_all(ev)
    np.testing.assert_allclose(got["negative-loss-squared"], -(got["loss"] ** 2))
    # K = 2: one OUT model per candidate, so the calibration is its loss
    out = np.where(~ev.inside, ev.reference_losses().numpy(), 0).sum(1)
    np.testing.assert_allclose(got["calibrated-loss"], out + got["loss"])
    assert list(score_all(evidence(None))) == ["loss", "negative-loss-squared"]


def test_a_broken_plugin_is_one_line_and_leaves_the_registry(tmp_path):
    bad = tmp_path / "membership_plugin_broken.py"
    bad.write_text(
        "from privaudit.eval.membership_attacks import register_membership_attack\n"
        "register_membership_attack('fine', lambda evidence: {})\n"
        "register_membership_attack('broken', lambda: {})\n"
    )
    before = dict(MEMBERSHIP_ATTACKS)
    with pytest.raises(PrivauditError, match="plugin .*membership attack 'broken'.*fix:"):
        load_plugins([bad])
    assert MEMBERSHIP_ATTACKS == before


def test_the_plugin_runs_through_the_api(tmp_path, one_thread, plugin):
    """−loss² ranks the candidates exactly as LOSS does (losses are ≥ 0), so its AUC is
    LOSS's; calibrated-loss trains the reference runs and the built-ins' scores come beside."""
    load_plugins([plugin])
    cfg = tiny("dsgd", rounds=4, batch_size=4, epsilon=None, params={"lr": 0.5})
    run = Run.create(cfg, tmp_path / "run")
    args = dict(victim=1, candidates=8, population=8, progress=False)
    r = model_mia(run, "dsgd-half-model", attack="negative-loss-squared", **args)
    d = r.details
    assert d["score"] == "negative-loss-squared" and d["references"] is None
    assert list(d["scores"]) == ["loss", "negative-loss-squared"]
    assert r.auc == d["scores"]["loss"]["auc"]
    assert d["natural"]["auc"] == d["natural"]["scores"]["loss"]["auc"]
    r = model_mia(run, "dsgd-half-model", attack="calibrated-loss", references=2, **args)
    d = r.details
    assert d["score"] == "calibrated-loss" and d["references"]["count"] == 2
    built_in = ["loss", "lira-online", "lira-offline", "rmia"]
    assert list(d["scores"]) == [*built_in, "negative-loss-squared", "calibrated-loss"]
    with pytest.raises(PrivauditError, match="--references 3: .*even number"):
        model_mia(run, "dsgd-half-model", attack="calibrated-loss", references=3, **args)


def test_the_plugin_runs_through_the_cli(tmp_path, capsys, plugin):
    argv = ["--plugin", str(plugin), "mia", "--target", "dsgd-half-model"]
    tiny_flags = ["--agents", "4", "--rounds", "3", "--batch-size", "4", "--threads", "1"]
    code, out, err = run_cli(
        capsys,
        *argv,
        "--attack",
        "negative-loss-squared",
        "--candidates",
        "8",
        "--population",
        "8",
        *tiny_flags,
        "--no-progress",
        "--json",
        "--out",
        str(tmp_path / "m"),
    )
    assert code == 0, err
    r = json.loads(out)
    assert r["attack"] == r["score"] == "negative-loss-squared"
    assert r["auc"] == r["scores"]["loss"]["auc"]
    header = (tmp_path / "m" / "scores.csv").read_text().splitlines()[0]
    assert header == "member,loss,negative-loss-squared"
