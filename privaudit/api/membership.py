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

The pooled scores give the ROC, AUC, TPR at low FPR with Clopper–Pearson intervals
(:mod:`privaudit.eval.membership`), the region (ε, δ)-DP allows for the attacked kind's
one-release ε where it is formal (the message is one Gaussian release of the batch it
contains: membership in it is add/remove of one example at sample rate 1), the points
above it (violations) and an ε lower bound from real examples.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from privaudit.attacks import infer_labels
from privaudit.attacks.membership import score_candidates
from privaudit.core.accounting import account
from privaudit.core.errors import PrivauditError
from privaudit.core.files import to_jsonable, write_json
from privaudit.eval import membership as M
from privaudit.eval.labelcounts import count_accuracy, count_tv
from privaudit.sim.plan import locate
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

FPRS = (0.001, 0.01)  # the low false-positive rates reported (LiRA's convention)


@dataclass
class Scores:
    """Pooled, calibrated scores of every member and non-member over the observed messages,
    and per message its round, victim and label-count accuracy."""

    members: np.ndarray
    nonmembers: np.ndarray
    messages: list[dict[str, Any]]


def message_scores(
    run: Run,
    target: str,
    rounds: list[int],
    *,
    scorer: str = "decompose",
    threat: str | None = None,
    attackers: list[int] | None = None,
    victims: list[int] | None = None,
    population: int = 256,
    seed: int = 0,
    progress: bool = True,
) -> Scores:
    """Score the members and non-members of every observed message (module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    data = run.data
    pop = torch.randperm(len(data.test_x), generator=gen)[:population]
    ref = (data.test_x[pop], data.test_y[pop])
    members, nonmembers, rows = [], [], []
    for t in rounds:
        for sighting, obs in locate(
            run, target, t, threat=threat, attackers=attackers, victims=victims, progress=progress
        ):
            v = sighting.src
            batch = run.secret_index(t, v).cpu()
            if len(batch) == 0:
                rows.append({"round": t, "victim": v, "members": 0})
                continue
            shard = run.ctx.parts[v].cpu()
            rest = shard[~torch.isin(shard, batch)]
            out = rest[torch.randperm(len(rest), generator=gen)[: len(batch)]]
            xs = torch.cat([data.train_x[batch], data.train_x[out], ref[0]])
            ys = torch.cat([data.train_y[batch], data.train_y[out], ref[1]])
            s = score_candidates(obs, xs, ys, scorer, reference=ref).double().cpu().numpy()
            s_in, s_out, s_ref = np.split(s, [len(batch), len(batch) + len(out)])
            mu, sd = s_ref.mean(), s_ref.std() or 1.0
            members.append((s_in - mu) / sd)
            nonmembers.append((s_out - mu) / sd)
            true, guess = data.train_y[batch], infer_labels(obs, "auto").cpu()
            rows.append(
                {
                    "round": t,
                    "victim": v,
                    "receiver": sighting.dst,
                    "threat": sighting.threat.describe(),
                    "members": len(batch),
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
    return Scores(np.concatenate(members), np.concatenate(nonmembers), rows)


def mia(
    run: Run,
    target: str,
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
) -> dict[str, Any]:
    """Message-level membership inference on ``target``'s messages of rounds
    ``round .. round + messages − 1`` (module docstring); writes ``result.json`` and
    ``roc.png`` to ``out`` when given. Returns the result."""
    tgt = Target.parse(target)
    tgt.check_run(run, round)
    n = run.cfg.agents
    rounds = [
        r for r in range(round, round + messages) if max(tgt.rounds_needed(r, n)) <= run.cfg.rounds
    ]
    sc = message_scores(
        run,
        target,
        rounds,
        scorer=scorer,
        threat=threat,
        attackers=attackers,
        victims=victims,
        population=population,
        seed=seed,
        progress=progress,
    )
    delta = run.cfg.delta
    victim = sc.messages[0]["victim"]
    privacy = tgt.privacy(run, victim)
    q = run.resolved["agents"][victim]["sample_rate"]
    acc = account(privacy, delta, q, run.cfg.rounds, run.cfg.accountant)
    bound = acc["release"]  # one Gaussian release of the batch: ∞ where not formal
    points = {
        f"{f:g}": dataclass_dict(M.tpr_at_fpr(sc.members, sc.nonmembers, f, confidence))
        for f in FPRS
    }
    found = (
        [dataclass_dict(v) for v in M.violations(sc.members, sc.nonmembers, bound, delta)]
        if math.isfinite(bound)
        else []
    )
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
        "epsilon_release": bound if math.isfinite(bound) else None,
        "epsilon_release_reason": None if math.isfinite(bound) else privacy.reason,
        "delta": delta,
        "violations": found,
        "epsilon_lo": M.epsilon_lower_bound(
            sc.members, sc.nonmembers, delta, confidence, seed=seed
        ),
        "confidence": confidence,
        "label_counts_exact": float(np.mean([m["label_counts_exact"] for m in scored])),
        "label_tv": float(np.mean([m["label_tv"] for m in scored])),
        "per_message": sc.messages,
        "run": str(run.dir.path),
    }
    if out is not None:
        out = Path(out)
        write_json(out / "result.json", to_jsonable(result))
        title = f"{target} · rounds {rounds[0]}–{rounds[-1]} · {scorer}"
        M.plot_roc(
            {f"{scorer} (AUC {result['auc']:.3f})": (fpr, tpr)},
            out / "roc.png",
            bound=(bound, delta) if math.isfinite(bound) else None,
            title=title,
        )
        result["figure"] = str(out / "roc.png")
    return result


def dataclass_dict(obj: Any) -> dict[str, Any]:
    return {k: float(v) for k, v in dataclasses.asdict(obj).items()}
