"""The one-way path of an attack: run → captured messages → View → Observations → attack →
scores against the secret batch → ``result.json`` and a figure grid.

This is the Python API behind ``privaudit attack``; notebooks call it directly.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from privaudit.api.gossip import observe_beyond
from privaudit.attacks import DEFAULT_ATTACK, run_attack
from privaudit.attacks.identifiability import identifiability
from privaudit.core.errors import PrivauditError, Unobservable
from privaudit.core.files import to_jsonable, write_json
from privaudit.core.observation import Observation, Reconstruction
from privaudit.eval.figures import reconstruction_grid
from privaudit.eval.metrics import aggregate, score
from privaudit.eval.style import threat_text, title
from privaudit.sim.plan import Adversary, given_batch_size, locate
from privaudit.sim.run import Run
from privaudit.sim.targets import Target


def observe(
    run: Run,
    target: str | Target,
    round: int,
    links: list[tuple[int, int]] | None = None,
    threat: str | None = None,
    progress: bool = True,
    *,
    attackers: list[int] | None = None,
    victims: list[int] | None = None,
    tie: bool = False,
    adversary: Adversary | None = None,
) -> list[Observation]:
    """One Observation per victim of ``target``'s message of ``round``, as the
    ``adversary`` sees it (:class:`privaudit.sim.plan.Adversary`; or ``links``, ``threat``,
    ``attackers`` and ``victims`` as loose arguments), capturing (or re-simulating from the
    nearest checkpoint) only the links and rounds it needs. ``tie``: every victim by the
    coalition ``attackers``' gossip algebra under El Mrini et al.'s tied approximation
    (``observe_beyond(..., tie=True)``: refused on a run whose batches are not full, and
    for ``links`` or another threat).

    Victim, adversary and copy follow the planner's defaults (:mod:`privaudit.sim.plan`).
    A victim the named attackers cannot observe on their links is reached, where the
    defense states its linear structure, by the gossip algebra over every round they
    received (:func:`privaudit.api.gossip.observe_beyond`).
    ``links`` name the messages ``src → dst`` directly; else each of ``victims`` (default:
    the first non-attacker) is observed on its copy to the adversary; with ``threat=None``
    the weakest adversary that observes it; ``obs.meta["threat"]`` names it.

    The attacker is told the realised size of each batch behind the message (the usual
    known-batch-size assumption of gradient inversion; batches are Poisson, of expected size
    B): :func:`given_batch_size`."""
    adv = Adversary.of(adversary, threat=threat, links=links, attackers=attackers, victims=victims)
    tgt = Target.of(target)
    if tie:
        if not adv.reaches_beyond():
            raise PrivauditError(
                "tie=True observes named attackers' victims by the gossip algebra; it needs "
                "attackers, no links, and a threat model made of agents (neighbor, coalition)"
            )
        return observe_beyond(
            run, tgt, round, adv.attackers or (), adv.victims, tie=True, progress=progress
        )
    try:
        found = locate(run, tgt, round, adv, progress=progress)
    except Unobservable as direct:
        d = tgt.defense
        linear = d.recursion(run.params, run.ctx.W.cpu(), run.cfg.batch_size) is not None
        if not adv.reaches_beyond() or not linear:
            raise
        try:  # beyond the attackers' own links: what they received over rounds, solved
            return observe_beyond(run, tgt, round, adv.attackers, adv.victims, progress=progress)
        except Unobservable as beyond:
            raise Unobservable(f"{direct}; nor past its links: {beyond}") from None
    return [given_batch_size(run, obs, round) for _, obs in found]


def nonempty_rounds(run: Run, t: int, victims: list[int], within: int = 20) -> list[int]:
    """Up to two rounds nearest ``t`` (within ``within``) whose recorded secrets give one of
    ``victims`` a non-empty Poisson batch: where an attack has something to reconstruct."""
    near = sorted(
        range(max(1, t - within), min(run.cfg.rounds, t + within) + 1),
        key=lambda r: (abs(r - t), r),
    )
    found = []
    for r in near:
        if r != t and run.dir.has_secrets(r):
            sizes = run.batch_sizes(r)
            if any(sizes[v] for v in victims):
                found.append(r)
                if len(found) == 2:
                    break
    return sorted(found)


@dataclass
class AttackResult:
    """What one attack on a target found: the fields of ``result.json``.

    ε fields are None where ε is ∞ (``*_reason`` says why); ``metrics`` are the means over
    the observations with a batch (None where every batch was empty, then
    ``rounds_with_a_batch`` names the nearest recorded rounds where one is not); ``figure``
    is the grid's path once written."""

    target: str
    round: int
    attack: str
    attack_used: list[str | None]  # per observation, the attack whose answer it is
    fallback: list[str | None]  # per observation, why R-GAP handed over to IG, or None
    attack_options: dict[str, Any]
    threat: str
    adversaries: list[str]
    threat_chosen: bool
    links: list[list[int | None]]
    epsilon: float | None  # the attacked kind's ε over the run (worst agent)
    epsilon_reason: str | None
    epsilon_claimed: float  # the paper's count
    run_epsilon: float | None  # everything the run puts on the wire
    run_epsilon_reason: str | None
    delta: float
    sigma: float | None
    batch_size: int  # expected (Poisson); realised: batch_sizes
    batch_sizes: list[int]
    metrics: dict[str, float | None]
    spread: dict[str, float | None]
    lpips_note: str | None
    per_observation: list[dict[str, Any]]
    exact_observation: bool
    noise_std: list[float]
    rounds_with_a_batch: list[int]
    wall_s: float
    run: str
    # per observation: what its message can determine (privaudit.attacks.identifiability):
    # the numbers it carries vs the batch's unknowns, each linear layer's gradient rank, and
    # the sentence ("at most k of B examples are determined by this message")
    identifiability: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # per observation: what the attack itself recorded about how it solved it (its
    # Reconstruction's meta, less the copy of the observation's own provenance; plain JSON,
    # see attack_meta), e.g. CPA's {"attack": "cpa", "cpa": {"how": ..., "complete": ...}}
    attack_meta: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    figure: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict (``figure`` only once written), as ``result.json`` holds."""
        d = dataclasses.asdict(self)
        if d["figure"] is None:
            del d["figure"]
        return d


@dataclass
class Attempt:
    """One attack on a target: its ``result``, the secret batches, the reconstructions and
    the per-observation scores (eval only)."""

    result: AttackResult
    truths: list[tuple[torch.Tensor, torch.Tensor]]
    recons: list[Reconstruction]
    scores: list[dict[str, Any]]


def reconstruct(
    run: Run,
    target: str | Target,
    round: int,
    *,
    attack: str | None = None,
    links: list[tuple[int, int]] | None = None,
    threat: str | None = None,
    attackers: list[int] | None = None,
    victims: list[int] | None = None,
    iterations: int | None = None,
    restarts: int | None = None,
    seed: int = 0,
    options: dict[str, Any] | None = None,
    tie: bool = False,
    lpips: bool = True,
    progress: bool = True,
    adversary: Adversary | None = None,
) -> Attempt:
    """Observe ``target`` at ``round`` (see :func:`observe`), attack every observation as one
    batch (one per run of equal realised batch sizes) and score each against its secret
    batch; an empty batch has nothing to reconstruct and scores None (left out of
    ``metrics``).

    ``options`` are the attack's own keyword options (e.g. ``{"tv": 1e-3}`` for IG);
    ``adversary`` (or ``links``, ``threat``, ``attackers``, ``victims``) and ``tie``:
    :func:`observe`'s (``tie`` recorded with the options)."""
    attack = attack or DEFAULT_ATTACK
    tgt = Target.of(target)
    target = tgt.name  # the name, in what is written
    t0 = time.perf_counter()
    adv = Adversary.of(adversary, threat=threat, links=links, attackers=attackers, victims=victims)
    obs = observe(run, tgt, round, progress=progress, tie=tie, adversary=adv)
    kw = {k: v for k, v in (("iterations", iterations), ("restarts", restarts)) if v is not None}
    kw.update(options or {})
    device = run.ctx.device
    recons = run_attack(attack, [o.to(device) for o in obs], seed=seed, progress=progress, **kw)
    bounds = [identifiability(o).to_dict() for o in obs if o.batch_size]
    wall = time.perf_counter() - t0
    truths = [run.secret_batch(round, o.meta["src"]) for o in obs]
    scores = [
        score(ti, tl, r.images.detach().cpu(), r.labels.cpu(), lpips=lpips)
        for (ti, tl), r in zip(truths, recons, strict=True)
    ]
    summary = aggregate(scores)
    privacy = run.resolved["kinds"][tgt.kind]  # the attacked message kind's ε (worst agent)
    eps, run_eps = privacy["epsilon"], run.resolved["epsilon"]
    metrics = ("mse", "psnr", "ssim", "lpips", "label_acc")
    result = AttackResult(
        target=target,
        round=round,
        attack=attack,
        # per observation, the attack whose answer it is ("auto" picks one; None: empty batch)
        attack_used=[r.meta.get("attack") for r in recons],
        # per observation, why the attack handed over to another (R-GAP → IG), or None
        fallback=[r.meta.get("fallback") for r in recons],
        attack_options={**kw, "seed": seed, **({"tie": True} if tie else {})},
        threat=obs[0].meta["threat"].split()[0],
        adversaries=[o.meta["threat"] for o in obs],
        threat_chosen=adv.threat is None and not adv.attackers,
        links=[[o.meta["src"], o.meta["dst"]] for o in obs],
        # the attacked kind's ε over the run (None: ∞, with the reason) and the paper's count
        epsilon=eps if math.isfinite(eps) else None,
        epsilon_reason=None if math.isfinite(eps) else privacy["reason"],
        epsilon_claimed=privacy["epsilon_claimed"],
        # the run's ε: everything it puts on the wire (privaudit.core.accounting.run_privacy)
        run_epsilon=run_eps if math.isfinite(run_eps) else None,
        run_epsilon_reason=run.resolved["epsilon_reason"],
        delta=run.cfg.delta,
        sigma=run.resolved["sigma"],
        batch_size=run.cfg.batch_size,  # expected (Poisson); realised: batch_sizes
        batch_sizes=[o.batch_size for o in obs],
        metrics={m: summary[m]["mean"] for m in metrics},
        spread={m: summary[m]["std"] for m in ("mse", "psnr", "ssim")},
        lpips_note=summary["lpips_note"],
        per_observation=[{k: s[k] for k in metrics} for s in scores],
        exact_observation=all(o.meta.get("exact", False) for o in obs),
        noise_std=[o.noise_std for o in obs],
        # where every victim's batch is empty: the nearest recorded rounds where it is not
        rounds_with_a_batch=[]
        if any(o.batch_size for o in obs)
        else nonempty_rounds(run, round, [o.meta["src"] for o in obs]),
        wall_s=float(f"{wall:.3f}"),
        run=str(run.dir.path),
        identifiability=bounds,
        attack_meta=[attack_meta(r, o) for r, o in zip(recons, obs, strict=True)],
    )
    return Attempt(result, truths, recons, scores)


def attack_meta(rec: Reconstruction, obs: Observation) -> dict[str, Any]:
    """What the attack recorded about how it solved ``obs`` (``rec.meta``) as plain JSON,
    for ``result.json``'s ``attack_meta``: the attacks copy the observation's provenance
    into their meta (``meta["observation"]``), which ``links`` and ``adversaries`` already
    report, so every such copy is left out; tensors and numpy values become numbers and
    lists, and a value JSON cannot hold (a plugin's object) its ``str``, so that an
    attack's meta never stops the result from being written."""
    return _plain(_without_provenance(rec.meta, obs.meta))


def _without_provenance(value: Any, provenance: dict[str, Any]) -> Any:
    """``value`` with every ``"observation"`` entry that is a copy of ``provenance`` left
    out, at any depth (R-GAP nests IG's meta, which has its own)."""
    if isinstance(value, dict):
        return {
            k: _without_provenance(v, provenance)
            for k, v in value.items()
            if not (k == "observation" and isinstance(v, dict) and v == provenance)
        }
    if isinstance(value, list | tuple):
        return [_without_provenance(v, provenance) for v in value]
    return value


def _plain(value: Any) -> Any:
    """``value`` as :func:`~privaudit.core.files.to_jsonable` writes it, a leaf it cannot
    write as its ``str``."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    try:
        return to_jsonable(value)
    except TypeError:
        return str(value)


def attack(
    run: Run,
    target: str | Target,
    round: int,
    *,
    out: str | Path | None = None,
    **kw: Any,
) -> AttackResult:
    """:func:`reconstruct`, then write ``result.json`` and a figure grid to ``out``; returns
    the result (with ``figure``, its path, when written: not when every victim's batch was
    empty). ``kw``: :func:`reconstruct`'s."""
    a = reconstruct(run, target, round, **kw)
    result = a.result
    if out is not None:
        out = Path(out)
        write_json(out / "result.json", to_jsonable(result.to_dict()))
        if any(len(images) for images, _ in a.truths):  # else every batch was empty
            result.figure = str(_figure(out / "grid.png", a.truths, a.recons, a.scores, result))
    return result


def _figure(
    path: Path,
    truths: list[tuple[torch.Tensor, torch.Tensor]],
    recons: list[Reconstruction],
    scores: list[dict[str, Any]],
    result: AttackResult,
) -> Path:
    """Truth over reconstruction for every observation's batch, side by side, each column
    labelled with its victim, link and attack; the title names the threat, target, round
    and ε (:mod:`privaudit.eval.style`)."""
    true = torch.cat([t for t, _ in truths])
    rec = torch.cat(
        [r.images.detach().cpu()[s["perm"]] for r, s in zip(recons, scores, strict=True)]
    )
    per = {
        k: sum((s["per_image"][k] or [None] * len(s["perm"]) for s in scores), [])
        for k in ("psnr", "ssim", "lpips")
    }
    eps = result.epsilon
    head = title(
        threat_text(result.adversaries),
        result.target,
        result.round,
        eps if eps is not None else "ε = ∞ (no formal DP bound)",
        [result.attack],
    )
    labels = [  # per column: whose image, seen on which link, by which attack
        f"victim {src}\n{src}→{dst} · {used or result.attack}"
        for (images, _), (src, dst), used in zip(
            truths, result.links, result.attack_used, strict=True
        )
        for _ in range(len(images))
    ]
    return reconstruction_grid(true, rec, per, head, path, column_labels=labels)
