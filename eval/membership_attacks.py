"""Model-level membership attacks: the registry of what ``privaudit mia --attack NAME`` runs.

A model-level membership attack scores each candidate from models' outputs alone: the
attacked model's logits and, where the attack declares it needs them, the logits of
reference ("shadow") models trained with and without each candidate
(:mod:`privaudit.api.model_membership` trains those and draws the candidates). One registration
holds all an attack is: its name, its score function (an :class:`Evidence` in, one score per
candidate out, higher = more likely a member), what it needs of the reference runs
(:class:`ReferenceRuns`, or nothing) and the score it is judged by (``headline``). Built in,
each the score math of :mod:`privaudit.eval.membership_scoring`:

- ``loss``: LOSS (Yeom, Giacomelli, Fredrikson & Jha 2018), −cross-entropy of the attacked
  model; no reference runs;
- ``lira``: LiRA online and offline (Carlini, Chien, Nasr, Song, Terzis & Tramèr 2022,
  Alg. 1 and §VI.C), Gaussians on the logit-scaled confidence φ of the IN and OUT reference
  models; judged by ``lira-online``;
- ``rmia``: RMIA (Zarifzadeh, Liu, Cheng & Shokri 2024, Eqs. 3–5), the target/reference
  probability ratio of a candidate against the population z.

A plugin file (docs/extending.md) adds one with :func:`register_membership_attack`, the same
way; ``privaudit --plugin FILE mia --attack NAME`` and
:func:`privaudit.api.model_membership.model_mia` then run it. A call reports the scores of every
registered attack whose needs the reference runs it trained meet (:func:`score_all`), so
``--attack`` picks the headline and whether reference runs are trained, and the other
attacks' scores come beside it at no extra training.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from privaudit.core.errors import NameTaken, PrivauditError
from privaudit.core.extensions import calling, failure
from privaudit.eval import membership_scoring as M

__all__ = [
    "MEMBERSHIP_ATTACKS",
    "PAIRED",
    "Declared",
    "Evidence",
    "ReferenceRuns",
    "check_membership_attack",
    "check_references",
    "declared",
    "register_membership_attack",
    "score_all",
]

WHAT = "membership attack"  # how errors and the plugin loader name this extension point
GLOBAL_VARIANCE_BELOW = 64  # LiRA pools σ² over candidates below this many references (§VI.B)


@dataclass(frozen=True)
class ReferenceRuns:
    """What an attack needs of the reference runs: at least ``least`` of them, drawn in
    complementary pairs (run 2j trains on a random half of the candidates, run 2j + 1 on the
    other half), so that every candidate is IN in exactly half of them — the IN/OUT split
    LiRA fits its two Gaussians to and RMIA averages over — and the number K is even.

    :meth:`check` is the one place the count is checked, with the one line naming the fix."""

    least: int = 2

    def met(self, k: int) -> bool:
        """Whether ``k`` reference runs serve the attack."""
        return k >= max(self.least, 2) and k % 2 == 0

    def check(self, k: int) -> None:
        """Refuse ``k`` reference runs that do not serve the attack, with one line."""
        if not self.met(k):
            least = max(self.least, 2)
            raise PrivauditError(
                f"--references {k}: reference runs come in complementary pairs (each "
                f"candidate IN in half of them); pass an even number ≥ {least}, e.g. "
                f"--references {max(least, 8)}"
            )


PAIRED = ReferenceRuns()  # LiRA's and RMIA's: any even number of reference runs ≥ 2


@dataclass(frozen=True)
class Evidence:
    """What a score function sees: logits in float64 of the attacked model and of the K
    reference models on the n candidates (members then non-members) and on the population
    z (test-split examples no model trained on), their labels, and which candidates each
    reference model trained on. The reference fields are None where no reference runs were
    trained (an attack that needs none)."""

    logits: Tensor  # (n, classes): the attacked model on the candidates
    labels: Tensor  # (n,) int64
    population_logits: Tensor  # (|z|, classes)
    population_labels: Tensor  # (|z|,) int64
    reference_logits: Tensor | None = None  # (K, n, classes)
    reference_population_logits: Tensor | None = None  # (K, |z|, classes)
    inside: np.ndarray | None = None  # (n, K) bool: candidate i in reference run c's shard

    @property
    def references(self) -> int:
        """K, the number of reference models (0 without reference runs)."""
        return 0 if self.reference_logits is None else int(self.reference_logits.shape[0])

    def losses(self) -> Tensor:
        """(n,) cross-entropy of the attacked model on each candidate."""
        return F.cross_entropy(self.logits, self.labels, reduction="none")

    def reference_losses(self) -> Tensor:
        """(n, K) cross-entropy of each reference model on each candidate."""
        if self.reference_logits is None:
            raise PrivauditError(
                "this evidence holds no reference models; declare references=PAIRED at "
                "register_membership_attack to have them trained"
            )
        refs = self.reference_logits
        flat = F.cross_entropy(
            refs.reshape(-1, refs.shape[-1]), self.labels.repeat(len(refs)), reduction="none"
        )
        return flat.view(len(refs), -1).T


Score = Callable[[Evidence], Any]  # → {score name: (n,) scores}, or one (n,) array


@dataclass(frozen=True)
class Declared:
    """What an attack declares beside its score function: its need for reference runs
    (None: it trains none), the score that is its headline, and one line for listings."""

    references: ReferenceRuns | None
    headline: str
    summary: str


MEMBERSHIP_ATTACKS: dict[str, Score] = {}
DECLARED: dict[str, Declared] = {}  # attack → what it declared at registration


def check_membership_attack(name: str, fn: Any) -> None:
    """Raise one clear error unless ``fn`` is a function of one positional argument, the
    :class:`Evidence` (further parameters need defaults)."""
    fix = (
        f"; fix: define it as def score(evidence) -> dict of score name → one score per "
        f"candidate, and register it with @register_membership_attack({name!r})"
    )
    if not callable(fn) or isinstance(fn, type):
        raise PrivauditError(f"{WHAT} {name!r} is a {type(fn).__name__}, not a function{fix}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise PrivauditError(f"{WHAT} {name!r} has no signature Python can inspect{fix}") from None
    P = inspect.Parameter
    variadic = (P.VAR_POSITIONAL, P.VAR_KEYWORD)
    required = [p.name for p in params[1:] if p.default is P.empty and p.kind not in variadic]
    if not params or params[0].kind not in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
        raise PrivauditError(f"{WHAT} {name!r} takes no positional argument for the evidence{fix}")
    if required:
        raise PrivauditError(f"{WHAT} {name!r} requires {', '.join(required)}{fix}")


def register_membership_attack(
    name: str,
    fn: Score | None = None,
    *,
    references: ReferenceRuns | None = None,
    headline: str | None = None,
    summary: str | None = None,
) -> Any:
    """Add a model-level membership attack under ``name``: its score function, its need for
    reference runs (``references``: a :class:`ReferenceRuns`, e.g. :data:`PAIRED`; None: it
    needs none), the score it is judged by (``headline``; default ``name``) and a one-line
    ``summary`` (default: the function's docstring's first line). As a decorator
    (``@register_membership_attack("mine", references=PAIRED)``) or a call
    (``register_membership_attack("mine", fn)``). Refused when the name is taken
    (:class:`~privaudit.core.errors.NameTaken`) or the declaration is malformed. Returns the
    function."""

    def add(f: Score) -> Score:
        if name in MEMBERSHIP_ATTACKS:
            raise NameTaken(WHAT, name)
        check_membership_attack(name, f)
        if references is not None and not (
            isinstance(references, ReferenceRuns)
            and isinstance(references.least, int)
            and references.least >= 1
        ):
            raise PrivauditError(
                f"{WHAT} {name!r} declares references={references!r}; fix: pass None (no "
                "reference runs) or ReferenceRuns(least=N) with N ≥ 1, e.g. PAIRED"
            )
        head = name if headline is None else headline
        if not isinstance(head, str) or not head:
            raise PrivauditError(
                f"{WHAT} {name!r} declares headline={head!r}; fix: name one of the scores its "
                "function returns (default: the attack's own name)"
            )
        line = summary or (f.__doc__ or "").strip().split("\n")[0]
        MEMBERSHIP_ATTACKS[name] = f
        DECLARED[name] = Declared(references, head, line)
        return f

    return add if fn is None else add(fn)


def declared(name: str) -> Declared:
    """What the registered attack ``name`` declared, or one line listing those there are."""
    if name not in MEMBERSHIP_ATTACKS:
        raise PrivauditError(
            f"--attack must be grad or one of {', '.join(MEMBERSHIP_ATTACKS)}, got {name!r}"
        )
    return DECLARED[name]


def check_references(name: str, k: int) -> None:
    """Refuse, before any training, ``k`` reference runs that the attack ``name`` cannot use
    (:meth:`ReferenceRuns.check`); an attack that needs none takes any ``k``."""
    need = declared(name).references
    if need is not None:
        need.check(k)


def _serves(name: str, evidence: Evidence) -> bool:
    need = DECLARED[name].references
    return need is None or (evidence.inside is not None and need.met(evidence.references))


def _answer(name: str, fn: Score, evidence: Evidence) -> dict[str, np.ndarray]:
    """``fn(evidence)``, checked: a mapping of score names to one finite number per
    candidate (a bare array is the attack's own name's); a plugin's exception or bad answer
    is one line naming it (:mod:`privaudit.core.extensions`)."""
    with calling(WHAT, name, fn, "score function"):
        got = fn(evidence)
    got = got if isinstance(got, dict) else {name: got}
    n = len(evidence.labels)
    out: dict[str, np.ndarray] = {}
    for key, s in got.items():
        a = s.detach().cpu().numpy() if isinstance(s, Tensor) else s
        a = np.asarray(a) if isinstance(a, np.ndarray | list | tuple) else a
        ok = (
            isinstance(key, str)
            and isinstance(a, np.ndarray)
            and a.shape == (n,)
            and a.dtype.kind in "fiu"
            and bool(np.isfinite(a).all())
        )
        if not ok:
            shape = getattr(a, "shape", type(a).__name__)
            raise failure(
                WHAT,
                name,
                fn,
                "score function",
                f"answered {key!r}: {shape} (not one finite number per candidate, n = {n})",
                "return {score name: an array of one finite number per candidate}",
            )
        out[key] = a.astype(np.float64, copy=False)
    return out


def score_all(evidence: Evidence) -> dict[str, np.ndarray]:
    """Every candidate's scores under each registered attack whose needs ``evidence`` meets
    (those needing reference runs only where it holds enough of them), in registration
    order: score name → (n,) float64, higher = more likely a member."""
    out: dict[str, np.ndarray] = {}
    for name, fn in MEMBERSHIP_ATTACKS.items():
        if not _serves(name, evidence):
            continue
        for key, s in _answer(name, fn, evidence).items():
            if key in out:
                raise failure(
                    WHAT,
                    name,
                    fn,
                    "score function",
                    f"answered a score {key!r} that another attack already gives",
                    "name your scores after your attack",
                )
            out[key] = s
    return out


# -- the built-ins ------------------------------------------------------------------------------
def _probability(logits: Tensor, labels: Tensor) -> np.ndarray:
    """The softmax probability of each example's label, over any leading dimensions."""
    p = torch.softmax(logits, -1).gather(-1, labels[..., None].expand(*logits.shape[:-1], 1))
    return p.squeeze(-1).numpy()


@register_membership_attack("loss", summary="LOSS: −cross-entropy, no reference runs")
def loss(evidence: Evidence) -> dict[str, np.ndarray]:
    """LOSS (Yeom et al. 2018, "Privacy Risk in Machine Learning"): a model fits its
    training examples better, so score = −cross-entropy of the attacked model."""
    return {"loss": M.loss_score(evidence.losses())}


@register_membership_attack(
    "lira", references=PAIRED, headline="lira-online", summary="LiRA, online and offline"
)
def lira(evidence: Evidence) -> dict[str, np.ndarray]:
    """LiRA (Carlini et al. 2022, Alg. 1 and §VI.C): Gaussians fit per candidate to the
    logit-scaled confidence φ of the reference models trained with it (online: IN and OUT)
    or without it (offline: OUT only); σ² pooled over candidates below
    :data:`GLOBAL_VARIANCE_BELOW` reference models (§VI.B)."""
    refs, y = evidence.reference_logits, evidence.labels
    assert refs is not None and evidence.inside is not None  # its need (PAIRED) is met
    phi_t = M.logit_confidence(evidence.logits, y)
    phi = np.stack([M.logit_confidence(refs[c], y) for c in range(len(refs))], 1)
    inside = evidence.inside
    gv = len(refs) < GLOBAL_VARIANCE_BELOW
    return {
        "lira-online": M.lira_online(
            phi_t, np.where(inside, phi, np.nan), np.where(inside, np.nan, phi), global_variance=gv
        ),
        "lira-offline": M.lira_offline(phi_t, np.where(inside, np.nan, phi), global_variance=gv),
    }


@register_membership_attack("rmia", references=PAIRED, summary="RMIA against the population")
def rmia(evidence: Evidence) -> dict[str, np.ndarray]:
    """RMIA (Zarifzadeh et al. 2024, Eqs. 3–5), online: the target/reference probability
    ratio of each candidate against that of the population z, the reference models' mean
    over IN and OUT alike. No score without population examples."""
    refs, refs_z = evidence.reference_logits, evidence.reference_population_logits
    assert refs is not None and refs_z is not None  # its need (PAIRED) is met
    y, yz = evidence.labels, evidence.population_labels
    if not len(yz):
        return {}
    k = len(refs)
    px = _probability(refs, y.expand(k, -1)).T  # (n, K)
    pz = _probability(refs_z, yz.expand(k, -1)).T
    target_z = _probability(evidence.population_logits, yz)
    return {"rmia": M.rmia(_probability(evidence.logits, y), px, target_z, pz)}
