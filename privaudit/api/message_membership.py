"""Membership and label leakage from the messages an adversary receives — at any batch size.

Gradient inversion of a 64-image batch recovers nothing, but the message still says *who
is in the batch* and *which labels it holds*. For each observed message (the planner's
defaults: :func:`privaudit.sim.plan.locate`, one per round of ``rounds`` and victim):

- **members**: the victim's realised batch of that round (the run's secrets);
- **non-members**: as many examples of the victim's own shard that are not in that batch
  (same distribution, same agent: the question is membership in *this message*);
- **scores**: each candidate's own gradient at the message's evaluation point against the
  message (:func:`privaudit.attacks.membership.score_candidates`: ``decompose`` — the
  message as a combination of every candidate's gradient — by default; ``lr`` the Gaussian
  log-likelihood ratio under the message's stated noise), with ``population`` public
  examples of the test split as the attacker's population statistics (never candidates);
- **calibration**: each message's scores are standardised by the same scorer's scores of
  those public examples (what the attacker can compute: they are non-members), so that
  messages of different rounds share one threshold;
- **labels**: the label counts inferred from the message's last layer
  (:func:`privaudit.attacks.infer_labels`) against the batch's true counts.

The pooled scores give the ROC, AUC and TPR at low FPR with Clopper–Pearson intervals
(:mod:`privaudit.eval.membership_scoring`): what the attack achieves. The candidates of one message
share its noise, so they are not independent trials, and the two statistical claims are made
only where they hold:

- **the ε lower bound** is the one-run analysis of Steinke, Nasr & Jagielski 2023 over
  member/non-member **pairs** (:func:`privaudit.eval.membership_scoring.pair_audit`): each message's
  members are matched at random with its non-members. Given the pairs, every way of picking
  one member per pair is equally likely, because a Poisson batch's probability depends on its
  size alone and the non-members are drawn uniformly from the rest of the shard. So which
  one of a pair is in is an independent fair coin, whatever the scores share. The scorer
  sees each message's candidates in a random order, so its scores are a function of the
  message and the unordered candidates. A coin swaps one example of one batch, so the bound
  is on the ε of one addition or removal through group privacy (2ε, (1 + e^ε)δ); it refutes
  the stated ε (``refuted``) where it exceeds the ε of every release of a batch in its round
  (one, or one per neighbour), through which alone a coin reaches the observed messages;
- **the violations** are ROC points above that swap's region for the attacked kind's
  one-release ε where it is formal (the message is one Gaussian release of the batch it
  contains, at sample rate 1), counted over **independent trials only**: one pair per
  message, in an order drawn by a fair coin (:func:`independent_trials`), checked by
  :func:`privaudit.eval.membership_scoring.violations` at the run's ``confidence``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privaudit.api.membership_result import MembershipResult
from privaudit.attacks import infer_labels
from privaudit.attacks.membership import score_candidates
from privaudit.core.accounting import account
from privaudit.core.errors import PrivauditError
from privaudit.core.files import to_jsonable, write_columns, write_json
from privaudit.eval import fdp
from privaudit.eval import membership_scoring as M
from privaudit.eval.bounds import group_privacy
from privaudit.eval.labelcounts import count_accuracy, count_tv
from privaudit.sim.plan import Adversary, locate
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

CURVE = 100  # thresholds of a trade-off curve (its band's Bonferroni split)
FPRS = (0.001, 0.01)  # the low false-positive rates reported (LiRA's convention)


@dataclass
class Scores:
    """Pooled, calibrated scores of every member and non-member over the observed messages,
    per scored message its pairs (the scores of its members and of the non-members matched
    with them, pair j = entry j of each), and per message its round, victim and label-count
    accuracy."""

    members: np.ndarray
    nonmembers: np.ndarray
    pairs: list[tuple[np.ndarray, np.ndarray]]
    messages: list[dict[str, Any]]

    def paired(self) -> tuple[np.ndarray, np.ndarray]:
        """Every pair's member and non-member score, over all messages."""
        if not self.pairs:
            return np.zeros(0), np.zeros(0)
        return (
            np.concatenate([s_in for s_in, _ in self.pairs]),
            np.concatenate([s_out for _, s_out in self.pairs]),
        )


def independent_trials(
    pairs: list[tuple[np.ndarray, np.ndarray]], seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """One trial per message, so that no two trials share a message's noise: a pair drawn at
    random, in an order drawn by a fair coin, scored first − second; returned as the scores
    of the trials whose first is the member and of those whose first is not. A trial tests
    which of two examples is in: a swap, so its region is (2ε, (1 + e^ε)δ) for an (ε, δ)
    claim of one addition or removal (module docstring)."""
    rng = np.random.default_rng(seed + 7919)
    first_in, stat = [], []
    for s_in, s_out in pairs:
        if len(s_in) == 0:
            continue
        j = int(rng.integers(len(s_in)))
        coin = bool(rng.random() < 0.5)
        first_in.append(coin)
        stat.append(s_in[j] - s_out[j] if coin else s_out[j] - s_in[j])
    first, stat_a = np.asarray(first_in, bool), np.asarray(stat, float)
    return stat_a[first], stat_a[~first]


def message_scores(
    run: Run,
    target: str | Target,
    rounds: list[int],
    *,
    scorer: str = "decompose",
    threat: str | None = None,
    attackers: list[int] | None = None,
    victims: list[int] | None = None,
    population: int = 256,
    seed: int = 0,
    progress: bool = True,
    adversary: Adversary | None = None,
) -> Scores:
    """Score the members and non-members of every message ``adversary`` observes (or
    ``threat``, ``attackers`` and ``victims``: :meth:`~privaudit.sim.plan.Adversary.of`),
    module docstring."""
    adv = Adversary.of(adversary, threat=threat, attackers=attackers, victims=victims)
    gen = torch.Generator().manual_seed(seed)
    data = run.data
    pop = torch.randperm(len(data.test_x), generator=gen)[:population]
    ref = (data.test_x[pop], data.test_y[pop])
    members, nonmembers, pairs, rows = [], [], [], []
    for t in rounds:
        for sighting, obs in locate(run, target, t, adv, progress=progress):
            v = sighting.src
            batch = run.secret_index(t, v).cpu()
            if len(batch) == 0:
                rows.append({"round": t, "victim": v, "members": 0})
                continue
            shard = run.ctx.parts[v].cpu()
            rest = shard[~torch.isin(shard, batch)]
            out = rest[torch.randperm(len(rest), generator=gen)[: len(batch)]]
            cands = torch.cat([batch, out])
            order = torch.randperm(len(cands), generator=gen)  # not members first
            xs = torch.cat([data.train_x[cands[order]], ref[0]])
            ys = torch.cat([data.train_y[cands[order]], ref[1]])
            s = score_candidates(obs, xs, ys, scorer, reference=ref).double().cpu().numpy()
            s_ref = s[len(cands) :]
            s_cand = np.empty(len(cands))
            s_cand[order.numpy()] = s[: len(cands)]
            mu, sd = s_ref.mean(), s_ref.std() or 1.0
            s_in, s_out = np.split((s_cand - mu) / sd, [len(batch)])
            members.append(s_in)
            nonmembers.append(s_out)
            k = min(len(s_in), len(s_out))  # out is a random draw: a random matching
            pairs.append((s_in[:k], s_out[:k]))
            true, guess = data.train_y[batch], infer_labels(obs, "auto").cpu()
            rows.append(
                {
                    "round": t,
                    "victim": v,
                    "receiver": sighting.dst,
                    "threat": sighting.threat.describe(),
                    "members": len(batch),
                    "pairs": k,
                    "auc": M.auc(s_in, s_out) if len(out) else None,
                    "label_counts_exact": count_accuracy(guess, true, obs.num_classes),
                    "label_tv": count_tv(guess, true, obs.num_classes),
                }
            )
    if not members:
        raise PrivauditError(
            f"every victim's batch of {target} is empty in rounds {rounds[0]}..{rounds[-1]} "
            "(Poisson sampling): nothing is a member; observe more rounds (--messages)"
        )
    return Scores(np.concatenate(members), np.concatenate(nonmembers), pairs, rows)


def mia(
    run: Run,
    target: str | Target,
    round: int,
    *,
    messages: int = 8,
    scorer: str = "decompose",
    threat: str | None = None,
    attackers: list[int] | None = None,
    victims: list[int] | None = None,
    population: int = 256,
    confidence: float = 0.95,
    seed: int = 0,
    out: str | Path | None = None,
    progress: bool = True,
    adversary: Adversary | None = None,
) -> MembershipResult:
    """Message-level membership inference on ``target``'s messages of rounds
    ``round .. round + messages − 1`` as ``adversary`` (or ``threat``, ``attackers``,
    ``victims``) observes them (module docstring); writes ``result.json`` and ``roc.png`` to
    ``out`` when given. Returns the result (its message-level entries in ``details``)."""
    adv = Adversary.of(adversary, threat=threat, attackers=attackers, victims=victims)
    tgt = Target.of(target)
    target = tgt.name  # the name, in what is written
    tgt.check_run(run, round)
    n = run.cfg.agents
    rounds = [
        r for r in range(round, round + messages) if max(tgt.rounds_needed(r, n)) <= run.cfg.rounds
    ]
    sc = message_scores(
        run,
        tgt,
        rounds,
        scorer=scorer,
        population=population,
        seed=seed,
        progress=progress,
        adversary=adv,
    )
    delta = run.cfg.delta
    victim = sc.messages[0]["victim"]
    privacy = tgt.privacy(run, victim)
    q = run.resolved["agents"][victim]["sample_rate"]
    acc = account(privacy, delta, q, run.cfg.rounds, run.cfg.accountant)
    bound = acc["release"]  # one Gaussian release of the batch: ∞ where not formal
    finite = math.isfinite(bound)
    points = {
        f"{f:g}": dataclass_dict(M.tpr_at_fpr(sc.members, sc.nonmembers, f, confidence))
        for f in FPRS
    }
    found, checked = region_violations(sc, bound, delta, confidence, seed)
    per_coin = account(  # a coin's batch reaches later messages only through its round
        privacy, delta, q, run.cfg.rounds, run.cfg.accountant, copies=privacy.releases
    )["release"]
    lo, analysis = pairs_lower_bound(sc, delta, confidence, seed)
    analysis["epsilon_stated"] = per_coin if finite else None
    fpr, tpr = M.roc(sc.members, sc.nonmembers)
    scored = [m for m in sc.messages if m["members"]]
    result: dict[str, Any] = {
        "target": target,
        "rounds": rounds,
        "attack": "grad",
        "scorer": scorer,
        "threat": scored[0]["threat"],
        "members": int(len(sc.members)),
        "nonmembers": int(len(sc.nonmembers)),
        "auc": M.auc(sc.members, sc.nonmembers),
        "tpr_at_fpr": points,
        "epsilon_release": bound if finite else None,
        "epsilon_release_reason": None if finite else privacy.reason,
        "delta": delta,
        "violations": found,
        "violations_analysis": checked,
        "epsilon_lo": lo,
        "epsilon_lo_analysis": analysis,
        "refuted": None if not finite or lo is None else bool(lo > per_coin),
        "confidence": confidence,
        "tradeoff": tradeoff(sc.members, sc.nonmembers, confidence),
        "label_counts_exact": float(np.mean([m["label_counts_exact"] for m in scored])),
        "label_tv": float(np.mean([m["label_tv"] for m in scored])),
        "per_message": sc.messages,
        "run": str(run.dir.path),
    }
    if out is not None:
        _write_outputs(Path(out), result, sc, (fpr, tpr), bound if finite else None)
    return MembershipResult.from_dict(result)


def _write_outputs(
    out: Path, result: dict[str, Any], sc: Scores, roc: tuple[Any, Any], bound: float | None
) -> None:
    """``scores.csv`` (every member's and non-member's score), ``result.json``, the ROC
    with the region ``bound`` allows and the trade-off figure, their paths in ``result``."""
    member = np.r_[np.ones(len(sc.members), bool), np.zeros(len(sc.nonmembers), bool)]
    write_columns(out / "scores.csv", {"member": member, "score": np.r_[sc.members, sc.nonmembers]})
    result["scores_file"] = "scores.csv"
    write_json(out / "result.json", to_jsonable(result))
    rounds, scorer, delta = result["rounds"], result["scorer"], result["delta"]
    title = f"{result['threat']} · {result['target']} · rounds {rounds[0]}–{rounds[-1]} · {scorer}"
    M.plot_roc(
        {f"{scorer} (AUC {result['auc']:.3f})": roc},
        out / "roc.png",
        bound=(bound, delta) if bound is not None else None,
        title=title,
    )
    result["figure"] = str(out / "roc.png")
    mu = fdp.gdp_mu(bound, delta) if bound is not None else None  # one Gaussian release's μ
    curve = result["tradeoff"]["curve"]
    result["tradeoff_figure"] = str(fdp.plot_tradeoff(curve, out / "tradeoff.png", mu, title))


def tradeoff(members: Any, nonmembers: Any, confidence: float) -> dict[str, Any]:
    """The scores' empirical trade-off curve (FPR against FNR with its Clopper–Pearson band,
    :func:`privaudit.eval.fdp.tradeoff_curve` at :data:`CURVE` thresholds) and the μ below
    which no μ-GDP mechanism gives it (:func:`privaudit.eval.fdp.mu_lower_bound`)."""
    curve = fdp.tradeoff_curve(members, nonmembers, confidence, CURVE)
    return {"mu_lo": fdp.mu_lower_bound(curve), "curve": curve}


def region_violations(
    sc: Scores, bound: float, delta: float, confidence: float, seed: int
) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """ROC points above the (ε, δ) region of a swap at the kind's one-release ``bound``,
    over independent trials only (one pair per message, :func:`independent_trials`), at
    ``confidence``; and how they were checked. None found where ``bound`` is ∞."""
    t_in, t_out = independent_trials(sc.pairs, seed)
    finite = math.isfinite(bound)
    region = group_privacy(bound, delta, 2)  # a trial tells which of two is in: a swap
    found = (
        [dataclass_dict(v) for v in M.violations(t_in, t_out, *region, confidence)]
        if finite and len(t_in) and len(t_out)
        else []
    )
    checked = {
        "method": "independent messages: one member/non-member pair per message",
        "trials": int(len(t_in) + len(t_out)),
        "region": {"epsilon": region[0], "delta": region[1]} if finite else None,
    }
    return found, checked


def pairs_lower_bound(
    sc: Scores, delta: float, confidence: float, seed: int
) -> tuple[float | None, dict[str, Any]]:
    """The one-run ε lower bound over every member/non-member pair (Steinke, Nasr &
    Jagielski 2023; :func:`privaudit.eval.membership_scoring.pair_audit`), None without a pair,
    and its analysis (the caller adds the ε it is compared with)."""
    p_in, p_out = sc.paired()
    one_run = M.pair_audit(p_in, p_out, delta, confidence, seed=seed)
    lo = one_run["epsilon"] if len(p_in) else None
    return lo, {
        "method": "one-run over member/non-member pairs (Steinke, Nasr & Jagielski 2023)",
        "trials": one_run["pairs"],
        "guesses": one_run["guesses"],
        "correct": one_run["correct"],
        "epsilon_stated": None,
        "stated": "the ε of one round's releases of a batch, at sample rate 1 (every "
        "observed message depends on a pair's coin only through them)",
        "reason": None
        if lo is not None
        else "no message left a non-member to pair with a member (its batch took the "
        "whole shard): nothing to bound",
    }


def dataclass_dict(obj: Any) -> dict[str, Any]:
    return {k: float(v) for k, v in dataclasses.asdict(obj).items()}
