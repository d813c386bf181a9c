"""Model-level membership inference (:mod:`privaudit.api.model_membership`): the reference runs are
exact runs of the simulator (one copy of the batched disjoint union is the tool's own run),
cached, and LOSS / LiRA / RMIA separate members of an overfit model; the CLI end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import run_cli, tiny

from privaudit.api.model_membership import (
    draw_candidates,
    model_mia,
    reference_models,
    reference_seed,
    reference_shards,
    simulate_copies,
)
from privaudit.core.errors import PrivauditError
from privaudit.core.messages import CaptureSpec
from privaudit.eval.membership_scoring import auc as membership_auc
from privaudit.sim.run import Run


@pytest.mark.parametrize("defense", ["dsgd", "dp-dpsgd"])
def test_a_copy_of_the_batched_union_is_the_run_itself(tmp_path, one_thread, defense):
    """Copy 0 seeded as the run with the victim's own shard reproduces the run's final
    average model and its victim's last half-model message; copy 1 (another seed, another
    shard) equals the same copy simulated alone: the union changes nothing per copy."""
    cfg = tiny(defense, rounds=4, batch_size=4, sigma=1.0, epsilon=None, params={"lr": 0.1})
    run = Run.create(cfg, tmp_path / "run")
    final = run.train(progress=False)["x"].mean(0)
    v, dst = 0, 1
    own = run.ctx.parts[v].cpu()
    cands = draw_candidates(run, v, count=8, population=8)
    other = torch.cat([cands.known, cands.pool[reference_shards(cands, 2, 0)[0]]]).sort().values
    assert len(other) == len(own)
    seeds = [cfg.seed, reference_seed(cfg.seed, 0, 1)]
    both = simulate_copies(run, v, [own, other], seeds, cfg.rounds)
    torch.testing.assert_close(both[0], final.float(), rtol=1e-6, atol=1e-6)
    alone = simulate_copies(run, v, [other], seeds[1:], cfg.rounds)
    torch.testing.assert_close(both[1], alone[0], rtol=1e-6, atol=1e-6)
    assert (both[0] - both[1]).abs().max() > 1e-4  # the copies did differ
    msgs = simulate_copies(run, v, [own, other], seeds, 3, kind="half-model", receiver=dst)
    key = (3, v, dst, "half-model")
    seen = run.messages(CaptureSpec.of(rounds=[3], links=[(v, dst)], kinds=["half-model"]))
    torch.testing.assert_close(msgs[0], seen[key].float(), rtol=1e-6, atol=1e-6)


def test_candidates_and_reference_halves(tmp_path):
    """Members come from the victim's shard, non-members from the test split with the same
    labels, z apart from both; every candidate is IN in exactly half the reference runs."""
    run = Run.create(tiny("dsgd"), tmp_path / "run")
    c = draw_candidates(run, 2, population=32)
    shard = set(run.ctx.parts[2].tolist())
    n = c.n_train
    assert set(c.members.tolist()) <= shard and (c.nonmembers >= n).all()
    assert set(c.known.tolist()) | set(c.members.tolist()) == shard
    y_in = np.sort(run.data.train_y[c.members].numpy())
    y_out = np.sort(run.data.test_y[c.nonmembers - n].numpy())
    assert np.array_equal(y_in, y_out)
    assert not set(c.population.tolist()) & set(c.nonmembers.tolist())
    inside = reference_shards(c, 6, seed=3)
    assert (inside.sum(0) == 3).all() and (inside.sum(1) == len(c.members)).all()
    with pytest.raises(PrivauditError, match="even number"):
        reference_shards(c, 3, seed=0)


def _overfit(tmp_path, defense="dsgd", **kw):
    """Eight agents on label-skewed shards (Dirichlet 0.05, seed 1): agent 4 holds 10
    examples and samples each with rate B/n = 0.4, so 100 rounds are 40 epochs of its shard:
    its model memorises it. Non-members: the held-out tenth of the training split."""
    cfg = tiny(
        defense,
        agents=8,
        rounds=100,
        batch_size=4,
        seed=1,
        model="tanh-cnn",
        dirichlet_alpha=0.05,
        eval_split="validation",
        epsilon=None,
        params={"lr": 0.5},
        checkpoint_every=100,
        **kw,
    )
    return Run.create(cfg, tmp_path / "run")


VICTIM = 4


def test_scorers_separate_members_of_an_overfit_model_and_cache(tmp_path, one_thread):
    """LOSS, LiRA (online, offline) and RMIA on the final model of a run that memorised its
    shard: every score ranks members above non-members (AUC well above 0.5). A second call
    reads the reference runs back from the cache: no file is rewritten, the models are the
    same and the call says it trained nothing."""
    run = _overfit(tmp_path)
    args = dict(references=4, victim=VICTIM, population=16, progress=False)
    r = model_mia(run, "dsgd-half-model", attack="lira", out=tmp_path / "out", **args)
    d = r.details
    auc = {name: s["auc"] for name, s in d["scores"].items()}
    assert r.members == 10 and min(auc.values()) > 0.55, auc
    assert min(auc["loss"], auc["lira-online"], auc["rmia"]) > 0.7, auc
    assert d["references"]["trained"] and d["epsilon"] is None  # dsgd: no DP claim
    assert (tmp_path / "out" / "roc.png").exists()
    saved = json.loads((tmp_path / "out" / "result.json").read_text())
    assert saved["split"]["members"] == d["split"]["members"]
    # the raw scores of every candidate: each attack's AUC recomputed from scores.csv
    head, *rows = (tmp_path / "out" / saved["scores_file"]).read_text().splitlines()
    values = np.array([row.split(",") for row in rows], float).T
    cols = dict(zip(head.split(","), values, strict=True))
    m = cols["member"] == 1
    assert m.sum() == r.members
    assert membership_auc(cols["loss"][m], cols["loss"][~m]) == pytest.approx(auc["loss"])
    files = sorted(p for p in (tmp_path / "run" / "references").rglob("*") if p.is_file())
    stamps = [p.stat().st_mtime_ns for p in files]
    again = model_mia(run, "dsgd-half-model", attack="rmia", **args).details
    assert not again["references"]["trained"]
    assert [p.stat().st_mtime_ns for p in files] == stamps
    assert again["scores"]["rmia"] == d["scores"]["rmia"]
    cands = draw_candidates(run, VICTIM, None, 16)
    refs = reference_models(
        run, VICTIM, cands, 4, until=run.cfg.rounds, kind="half-model", receiver=d["receiver"]
    )
    assert not refs.trained and refs.models.shape[0] == 4


def test_final_model_and_dp_bound(tmp_path, one_thread):
    """``on="final"`` attacks the average model; a dp-dpsgd run gets the run-level ε over
    its rounds as the bound, and the game's one-run bound of a correct mechanism stays below
    it."""
    run = _overfit(tmp_path, "dp-dpsgd", sigma=1.0)
    r = model_mia(
        run, "dp-dpsgd-half-model", attack="loss", on="final", victim=VICTIM, progress=False
    )
    d = r.details
    assert d["on"] == "final" and d["references"] is None
    assert d["epsilon"] is not None and d["epsilon"] > 0 and r.refuted is False
    assert r.epsilon_lo <= d["epsilon"]
    with pytest.raises(PrivauditError, match="--on final"):
        model_mia(run, "dp-dpsgd-half-model", on="final", round=3, progress=False)


def test_cli_end_to_end_and_bad_input(tmp_path, capsys):
    tiny_flags = ["--agents", "4", "--rounds", "6", "--batch-size", "4", "--threads", "1"]
    code, out, err = run_cli(
        capsys,
        "mia",
        "--target",
        "dsgd-half-model",
        "--attack",
        "lira",
        "--references",
        "2",
        "--candidates",
        "16",
        "--population",
        "16",
        *tiny_flags,
        "--no-progress",
        "--out",
        str(tmp_path / "m"),
    )
    assert code == 0, err
    assert "lira-online" in out and "2 reference runs" in out
    assert (tmp_path / "m" / "result.json").exists() and (tmp_path / "m" / "roc.png").exists()
    for argv, needle in (
        (["--references", "0"], "--references 0"),
        (["--references", "3"], "even number"),
        (["--scorer", "lr"], "--scorer does nothing in the model-level attack"),
        (["--on", "later"], "--on must be"),
    ):
        code, _, err = run_cli(
            capsys,
            "mia",
            "--target",
            "dsgd-half-model",
            "--attack",
            "lira",
            *argv,
            "--out",
            str(tmp_path / "x"),
        )
        assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
        assert err.startswith("privaudit: error:") and not (tmp_path / "x").exists()
