"""Model-level membership inference with reference ("shadow") runs of the tool's own simulator.

The message-level attack (:mod:`privaudit.api.message_membership`) asks who is in the batch
behind one message; this module asks who is in the victim's *training set*, from a model:

- the **attacked model**: the victim's ``model`` / ``half-model`` message of round R as a
  neighbour receives it (``on="message"``; the planner's receiver, :mod:`privaudit.sim.plan`),
  or the run's final average model (``on="final"``: the mean of every agent's model after the
  last round, what a decentralized run hands out; the default where the target's kind is not
  a model);
- **candidates**: ``m`` examples of the victim's shard (``run.ctx.parts[victim]``) and ``m``
  from the run's test split (a held-out tenth of the training split when the run is
  evaluated on ``eval_split="validation"``), one of each shard example's label, in ``m``
  pairs of one label (shards are label-skewed);
- **the game** (the membership game of Steinke, Nasr & Jagielski 2023, in pairs): a fair
  coin per pair picks which of its two examples the victim trains on, and the attacked model
  is the run's, replayed (:func:`simulate_copies`, the run's own seed) with the victim's
  shard its non-candidate examples plus the picked ones. Members and non-members then have
  one distribution, so a shift between the shard and the test split separates nothing, and
  the shard keeps its size and Poisson rate (so the run's ε is the game's). The ε lower
  bound, and whether it refutes the run's ε, are the game's
  (:func:`privaudit.eval.membership_scoring.pair_audit`: each coin swaps one example, and the
  coins are independent and fair whatever the candidates' scores share); one model is one
  trial, so no ROC point is checked against the DP region;
- **the natural split**: the run's own model, the shard examples (members) against the test
  ones (non-members), reported as ``natural`` with no bound: a train/test shift raises it as
  much as membership does;
- **population** ``z``: further test-split examples, never a candidate and never trained on
  by any run (RMIA's reference population);
- **reference runs** (shadow models): ``K`` runs of the same defense at the same operating
  point — the target's RunConfig and resolved parameters (σ included), its graph, its public
  initial model x_0 and the other agents' shards — that differ in two things only: their
  agents' generators (batches and noise) are seeded by :func:`reference_seed`, and the
  victim's shard is its non-candidate examples (always in) plus one half of the 2m
  candidates. The halves come in complementary pairs (run 2j takes a random half, run 2j+1
  the other half), so every candidate is IN in exactly K/2 runs and the victim's shard keeps
  its size (and its Poisson rate q = B/n);
- **scores**: those of the registered membership attacks
  (:mod:`privaudit.eval.membership_attacks`, where a plugin adds its own): LOSS (Yeom et al.
  2018: −cross-entropy of the attacked model), LiRA online and offline (Carlini et al. 2022,
  Alg. 1 and §VI.C: Gaussians on the logit-scaled confidence φ of the IN and OUT reference
  models) and RMIA (Zarifzadeh et al. 2024, Eqs. 3–5: the target/reference probability ratio
  of x against the population z), each on the logits this module computes.

The K reference runs are **one** simulation of K·N agents on the disjoint union of K copies
of the graph (block-diagonal adjacency and mixing matrix W): a defense computes over stacked
agents and talks only along links, so copy c's agents see only copy c, and with copy c's
agents seeded as a run of seed s_c each copy is exactly that run (a defense with
``union_exact``: its round reads nothing else of the whole graph; tests/test_mia_models.py
checks a copy against the tool's own run). One vmap over K·N (model, batch) pairs per round
saves K − 1 rounds' overhead (on a CPU the gradients still cost about K times one run's).
A defense without ``union_exact`` (its round reads the number of agents or the spectrum of
W) simulates its references one copy at a time: exact, not batched.

Reference runs are cached under ``<run>/references/<key>/`` (the key: the run's identity,
K, the seed, the victim, the attacked model and the candidates), and so is the game's model
(the key: the run's identity, the victim, the attacked model and the game's shard): a second
call with the same settings reads them back instead of training again — only when the files
are what was written and by the code running now (:mod:`privaudit.api.cache`: a damaged
entry, or one written by another privaudit or plugin, is recomputed with one line on stderr).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load, save_file
from torch import Tensor
from torch.func import functional_call

from privaudit.api import cache
from privaudit.api.executor import commit_folder
from privaudit.api.membership_result import MembershipResult
from privaudit.api.message_membership import tradeoff
from privaudit.core import text
from privaudit.core.accounting import account
from privaudit.core.context import Context, agent_seed
from privaudit.core.errors import PrivauditError, Unobservable
from privaudit.core.files import digest, to_jsonable, write_columns, write_json
from privaudit.core.messages import CaptureSpec
from privaudit.eval import membership_attacks as attacks
from privaudit.eval import membership_scoring as M
from privaudit.sim.copies import Copy
from privaudit.sim.loop import calling
from privaudit.sim.plan import Adversary, sight
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

ONE_RUN = "one-run over the game's pairs (Steinke, Nasr & Jagielski 2023)"
MODEL_KINDS = ("model", "half-model")  # message kinds that carry an agent's model
ON = ("message", "final")
FPRS = (0.001, 0.01)
MODELS = "models.safetensors"  # a reference entry's tensors: the models and their ``inside``


# -- candidates -------------------------------------------------------------------------------
@dataclass
class Candidates:
    """Who is scored. Indices point into the *extended* training set ``train_x ++ test_x``
    (an index ≥ ``n_train`` is test-split example ``index − n_train``)."""

    members: Tensor  # m examples of the victim's shard
    nonmembers: Tensor  # m test-split examples (extended indices)
    known: Tensor  # the rest of the victim's shard: in every reference run
    population: Tensor  # RMIA's z: test-split examples no run trains on (extended indices)
    n_train: int

    @property
    def pool(self) -> Tensor:
        """Members then non-members: the 2m candidates in score order."""
        return torch.cat([self.members, self.nonmembers])

    @property
    def member(self) -> np.ndarray:
        m = len(self.members)
        return np.concatenate([np.ones(m, bool), np.zeros(len(self.nonmembers), bool)])


def draw_candidates(
    run: Run, victim: int, count: int | None = None, population: int = 256, seed: int = 0
) -> Candidates:
    """``m`` members of the victim's shard and ``m`` test-split non-members **of the same
    labels** (one of each member's class, so that a label-skewed shard does not tell members
    from non-members by their labels alone), drawn by a generator seeded ``seed``; then up to
    ``population`` further test-split examples as RMIA's z. ``m`` is ``count``, at most what
    the test split can match after keeping half of it (or ``population``) for z; default
    that most."""
    gen = torch.Generator().manual_seed(seed + 104729)
    shard = run.ctx.parts[victim].cpu()
    test_y, n_train = run.data.test_y, len(run.data.train_y)
    n_test = len(test_y)
    z_want = min(population, n_test // 2)
    test = torch.randperm(n_test, generator=gen)
    pool_test, z_test = test[: n_test - z_want], test[n_test - z_want :]
    perm = shard[torch.randperm(len(shard), generator=gen)]
    labels = run.data.train_y[perm]
    free = {int(c): pool_test[test_y[pool_test] == c].tolist() for c in labels.unique()}
    members, nonmembers = [], []
    for i, c in zip(perm.tolist(), labels.tolist(), strict=True):
        if free[c]:
            members.append(i)
            nonmembers.append(free[c].pop(0))
    most = len(members)
    m = most if count is None else count
    if not 1 <= m <= most:
        raise PrivauditError(
            f"--candidates {m}: the victim's shard ({len(shard)} examples) and the test split "
            f"({n_test}, less {z_want} population examples) give at most {most} members with "
            f"a non-member of the same label; pass --candidates 1..{most}"
        )
    members_t = torch.tensor(members[:m], dtype=torch.long)
    used = torch.tensor(nonmembers[m:] + nonmembers[:0], dtype=torch.long)  # unused matches
    left = torch.cat([used, pool_test[~torch.isin(pool_test, torch.tensor(nonmembers))], z_test])
    return Candidates(
        members=members_t.sort().values,
        nonmembers=(torch.tensor(nonmembers[:m], dtype=torch.long) + n_train).sort().values,
        known=shard[~torch.isin(shard, members_t)].sort().values,
        population=(left[-min(population, len(left)) :] + n_train).sort().values,
        n_train=n_train,
    )


@dataclass
class Game:
    """The game's draw (module docstring): ``pairs`` (m, 2) positions in
    :attr:`Candidates.pool`, a shard example and a test example of one label; ``coins``
    (m,) True where the pair's shard example is the one trained on."""

    pairs: np.ndarray
    coins: np.ndarray

    @property
    def member(self) -> np.ndarray:
        """(2m,) booleans over the pool: the candidates the game's victim trains on."""
        out = np.zeros(2 * len(self.pairs), bool)
        out[np.where(self.coins, self.pairs[:, 0], self.pairs[:, 1])] = True
        return out

    def split(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each pair's member's and non-member's score (pair j = entry j of each)."""
        first, second = scores[self.pairs[:, 0]], scores[self.pairs[:, 1]]
        return np.where(self.coins, first, second), np.where(self.coins, second, first)


def draw_game(run: Run, candidates: Candidates, seed: int = 0) -> Game:
    """Pair each shard candidate with a test candidate of its label (both in index order)
    and flip a fair coin per pair (a generator seeded by ``seed`` alone)."""
    m = len(candidates.members)
    y = labels_of(run, candidates.pool).numpy()
    pairs = []
    for c in np.unique(y[:m]):
        shard, test = np.flatnonzero(y[:m] == c), m + np.flatnonzero(y[m:] == c)
        pairs += list(zip(shard.tolist(), test.tolist(), strict=True))
    order = np.asarray(sorted(pairs), dtype=np.int64).reshape(-1, 2)
    coins = np.random.default_rng(seed + 15485863).random(len(order)) < 0.5
    return Game(order, coins)


def reference_seed(run_seed: int, seed: int, copy: int) -> int:
    """Reference run ``copy``'s seed: 31 bits of SHA-256, apart from the run's own seed."""
    h = hashlib.sha256(f"privaudit:reference:{run_seed}:{seed}:{copy}".encode()).digest()
    return int.from_bytes(h[:4], "little") >> 1


def reference_shards(candidates: Candidates, k: int, seed: int) -> np.ndarray:
    """``(k, 2m)`` booleans: candidate j is in reference run c's victim shard. Runs come in
    complementary pairs (a random half, then the other half): each candidate is IN in
    exactly k/2 runs and every run's shard has the victim's size."""
    attacks.PAIRED.check(k)
    rng = np.random.default_rng(seed + 1299709)
    n = len(candidates.pool)
    inside = np.zeros((k, n), bool)
    for j in range(k // 2):
        half = rng.permutation(n)[: n // 2]
        inside[2 * j, half] = True
        inside[2 * j + 1] = ~inside[2 * j]
    return inside


# -- the batched simulator --------------------------------------------------------------------
def _block_diagonal(m: Tensor, copies: int) -> Tensor:
    return torch.block_diag(*([m] * copies))


def simulate_copies(
    run: Run,
    victim: int,
    shards: list[Tensor],
    seeds: list[int],
    until: int,
    *,
    kind: str | None = None,
    receiver: int | None = None,
    progress: bool = False,
) -> Tensor:
    """Simulate ``len(shards)`` runs of ``run``'s defense at its operating point as ONE run of
    C·N agents on the disjoint union of C copies of its graph; copy c's victim holds
    ``shards[c]`` (indices into ``train_x ++ test_x``, sorted), its agents are seeded as a
    run of seed ``seeds[c]`` (:func:`~privaudit.core.context.agent_seed`), and every other
    agent holds its shard of ``run``. Returns ``(C, D)``: each copy's victim's ``kind``
    message of round ``until`` to ``receiver`` when ``kind`` is given, else each copy's
    average model after round ``until``.

    Exact per copy for a defense with ``union_exact`` (module docstring); seeded with
    ``run.cfg.seed`` and the victim's own shard, a copy is the target run itself."""
    ctx, n = run.ctx, run.cfg.agents
    if ctx.n_held != n:
        raise PrivauditError("reference runs need a run that holds every agent (not a rank's)")
    copies = len(shards)
    if len(seeds) != copies or copies < 1:
        raise PrivauditError("simulate_copies needs one seed per shard, and at least one shard")
    dev = ctx.device
    mean = torch.tensor(run.data.mean, dtype=torch.float32).view(-1, 1, 1)
    std = torch.tensor(run.data.std, dtype=torch.float32).view(-1, 1, 1)
    test_x = ((run.data.test_x - mean) / std).to(dev)
    parts = [
        (shards[c].to(dev) if a == victim else ctx.parts[a])
        for c in range(copies)
        for a in range(n)
    ]
    agents = list(range(copies * n))
    gens = [
        torch.Generator(device=dev).manual_seed(agent_seed(seeds[c], a))
        for c in range(copies)
        for a in range(n)
    ]
    union = Context(
        model=ctx.model,
        spec=ctx.spec,
        grads=ctx.grads,
        x0=ctx.x0,
        train_x=torch.cat([ctx.train_x, test_x]),
        train_y=torch.cat([ctx.train_y, run.data.test_y.to(dev)]),
        parts=parts,
        adj=_block_diagonal(ctx.adj, copies),
        W=_block_diagonal(ctx.W, copies),
        batch_size=ctx.batch_size,
        generators=gens,
        device=dev,
        holdout=list(ctx.holdout) * copies if ctx.holdout else [],
        val_x=ctx.val_x,
        val_y=ctx.val_y,
        agents=agents,
    )
    links = [] if kind is None else [(c * n + victim, c * n + receiver) for c in range(copies)]
    capture = CaptureSpec.of(rounds=[until], links=links, kinds=[kind] if kind else [])
    union_copy = Copy.of(run.loop.with_ctx(union), capture)
    # init, not restore(0): the union's generators are seeded copy by copy above
    with calling(run.defense, "init", 0):
        state = run.defense.init(union, run.params)
    bar, task = text.progress(until, f"{copies} reference run(s)", progress)
    with bar:  # never ended early (no stop_after): a state after every round
        state = union_copy.simulate(
            state, range(1, until + 1), after=lambda t, step: bar.advance(task)
        )
    if kind is None:
        return state["x"].detach().view(copies, n, -1).mean(1).float().cpu()
    rows, sent = [], union_copy.messages()
    for c in range(copies):
        key = (until, c * n + victim, c * n + receiver, kind)
        if key not in sent:
            raise PrivauditError(
                f"{run.defense.name} sent no {kind!r} message {victim}→{receiver} in round "
                f"{until}; pick a round and receiver where it does (privaudit targets)"
            )
        rows.append(sent[key].float())
    return torch.stack(rows)


# -- reference runs, cached -------------------------------------------------------------------
@dataclass
class References:
    """K reference runs' attacked models and which candidates each one trained on."""

    models: Tensor  # (K, D)
    inside: np.ndarray  # (K, 2m) bool
    seeds: list[int]
    path: Path
    trained: bool  # this call trained them (False: read back from the cache)
    seconds: float  # time this call spent on them


def reference_models(
    run: Run,
    victim: int,
    candidates: Candidates,
    k: int,
    *,
    until: int,
    kind: str | None = None,
    receiver: int | None = None,
    seed: int = 0,
    batch: int | None = None,
    progress: bool = False,
) -> References:
    """The K reference runs of the module docstring, from the cache under
    ``<run>/references/`` when it holds them, else simulated ``batch`` copies at a time
    (default: all K at once for a defense with ``union_exact``, one at a time otherwise)
    and written there."""
    inside = reference_shards(candidates, k, seed)
    seeds = [reference_seed(run.cfg.seed, seed, c) for c in range(k)]
    key = {
        "run": run.cfg.identity(),
        "references": k,
        "seed": seed,
        "victim": victim,
        "until": until,
        "kind": kind,
        "receiver": receiver,
        "candidates": digest([candidates.pool.tolist(), candidates.known.tolist()], 16),
    }
    pool = candidates.pool
    shards = [torch.cat([candidates.known, pool[inside[c]]]).sort().values for c in range(k)]
    models, folder, trained, seconds = cached_copies(
        run,
        victim,
        key,
        shards,
        seeds,
        inside,
        until=until,
        kind=kind,
        receiver=receiver,
        batch=batch,
        progress=progress,
    )
    return References(models, inside, seeds, folder, trained, seconds)


@dataclass
class Played:
    """The game's attacked model (:func:`game_model`)."""

    model: Tensor  # (D,)
    path: Path
    trained: bool
    seconds: float


def game_model(
    run: Run,
    victim: int,
    candidates: Candidates,
    game: Game,
    *,
    until: int,
    kind: str | None = None,
    receiver: int | None = None,
    progress: bool = False,
) -> Played:
    """The game's attacked model (module docstring): ``run`` replayed with its own seed and
    the victim's shard its non-candidate examples plus the game's members; the victim's
    ``kind`` message of round ``until`` to ``receiver``, or the average model after round
    ``until`` (``kind`` None). Cached under ``<run>/references/`` as the reference runs."""
    member = game.member
    shard = torch.cat([candidates.known, candidates.pool[member]]).sort().values
    key = {
        "run": run.cfg.identity(),
        "game": digest(shard.tolist(), 16),
        "victim": victim,
        "until": until,
        "kind": kind,
        "receiver": receiver,
    }
    models, folder, trained, seconds = cached_copies(
        run,
        victim,
        key,
        [shard],
        [run.cfg.seed],
        member[None],
        until=until,
        kind=kind,
        receiver=receiver,
        progress=progress,
    )
    return Played(models[0], folder, trained, seconds)


def cached_copies(
    run: Run,
    victim: int,
    key: dict[str, Any],
    shards: list[Tensor],
    seeds: list[int],
    inside: np.ndarray,
    *,
    until: int,
    kind: str | None,
    receiver: int | None,
    batch: int | None = None,
    progress: bool = False,
) -> tuple[Tensor, Path, bool, float]:
    """:func:`simulate_copies` of ``shards`` and ``seeds`` through the cache: read from
    ``<run>/references/<digest of key>/`` when it holds them (and their ``inside``, the
    candidates each copy trained on), checked by :mod:`privaudit.api.cache` (a damaged entry,
    or one written by other code, is recomputed with one line on stderr), else simulated
    ``batch`` copies at a time (default: all at once for a defense with ``union_exact``, one
    at a time otherwise) and written there whole. Returns the models, the folder, whether
    this call trained them and its seconds."""
    folder = run.dir.path / "references" / digest(key, 16)
    started = time.perf_counter()
    k = len(shards)
    got = cache.read(folder, [MODELS], key)
    if got is not None:
        held = load(got[MODELS])
        if held["models"].shape[0] == k and np.array_equal(held["inside"].numpy(), inside):
            return held["models"], folder, False, time.perf_counter() - started
        cache.discard(folder, "it holds other candidates under this key")
    step = batch or (k if run.defense.union_exact else 1)
    models = torch.cat(
        [
            simulate_copies(
                run,
                victim,
                shards[i : i + step],
                seeds[i : i + step],
                until,
                kind=kind,
                receiver=receiver,
                progress=progress,
            )
            for i in range(0, k, step)
        ]
    )
    tensors = {"models": models.contiguous(), "inside": torch.from_numpy(inside)}

    def write(tmp: Path) -> None:
        save_file(tensors, str(tmp / MODELS))
        cache.seal(tmp, key, {"seeds": seeds})

    commit_folder(folder, write, cache.MANIFEST)
    return models, folder, True, time.perf_counter() - started


# -- scoring ----------------------------------------------------------------------------------
def model_logits(run: Run, flats: Tensor, index: Tensor, chunk: int = 1024) -> Tensor:
    """``(M, n, classes)`` logits of each flat model of ``flats`` on the examples ``index``
    of ``train_x ++ test_x`` (normalised as the run trains)."""
    ctx, n_train = run.ctx, len(run.data.train_y)
    mean = torch.tensor(run.data.mean, dtype=torch.float32).view(-1, 1, 1)
    std = torch.tensor(run.data.std, dtype=torch.float32).view(-1, 1, 1)
    index = index.cpu()
    train = index < n_train
    x = torch.empty((len(index), *ctx.train_x.shape[1:]), dtype=ctx.train_x.dtype)
    x[train] = ctx.train_x[index[train].to(ctx.device)].cpu()
    x[~train] = (run.data.test_x[index[~train] - n_train] - mean) / std
    out = []
    with torch.no_grad():
        for flat in flats:
            params = ctx.spec.unflatten(flat.to(ctx.device, ctx.x0.dtype))
            rows = [
                functional_call(ctx.model, params, (x[i : i + chunk].to(ctx.device),)).cpu()
                for i in range(0, len(x), chunk)
            ]
            out.append(torch.cat(rows))
    return torch.stack(out).double()


def labels_of(run: Run, index: Tensor) -> Tensor:
    n_train = len(run.data.train_y)
    index = index.cpu()
    return torch.where(
        index < n_train,
        run.data.train_y[index.clamp(max=n_train - 1)],
        run.data.test_y[(index - n_train).clamp(min=0)],
    )


def model_scores(
    run: Run, target: Tensor, candidates: Candidates, refs: References | None
) -> dict[str, np.ndarray]:
    """Every candidate's score under each registered membership attack whose needs ``refs``
    meet (:func:`privaudit.eval.membership_attacks.score_all`: only those needing no
    reference runs where ``refs`` is None), higher = more likely a member: the logits of
    the attacked model ``target`` and of the reference models on the candidates and the
    population, as the attacks' :class:`~privaudit.eval.membership_attacks.Evidence`."""
    pool, z = candidates.pool, candidates.population
    y, yz = labels_of(run, pool), labels_of(run, z)
    n = len(pool)
    lt = model_logits(run, target[None], torch.cat([pool, z]))[0]
    seen = dict(logits=lt[:n], labels=y, population_logits=lt[n:], population_labels=yz)
    if refs is None:
        return attacks.score_all(attacks.Evidence(**seen))
    lr = model_logits(run, refs.models, torch.cat([pool, z]))  # (K, n + |z|, classes)
    evidence = attacks.Evidence(
        **seen,
        reference_logits=lr[:, :n],
        reference_population_logits=lr[:, n:],
        inside=refs.inside.T,  # (n, K)
    )
    return attacks.score_all(evidence)


# -- the attack --------------------------------------------------------------------------------
def observed_model(
    run: Run, tgt: Target, t: int, adversary: Adversary
) -> tuple[Tensor, int, int, str]:
    """The victim's ``tgt`` message of round ``t`` as the planner's ``adversary`` receives it
    (:func:`privaudit.sim.plan.sight`): the flat model, victim, receiver and adversary."""
    s = sight(run, tgt, t, adversary)[0]
    key = (t, s.src, s.dst, tgt.kind)
    got = run.messages(CaptureSpec.of(rounds=[t], links=[(s.src, s.dst)], kinds=[tgt.kind]))
    if key not in got:
        raise Unobservable(f"{tgt.name}: no message {s.src}→{s.dst} in round {t}")
    return got[key].float(), s.src, s.dst, s.threat.describe()


def model_mia(
    run: Run,
    target: str | Target,
    *,
    attack: str = "lira",
    references: int = 8,
    round: int | None = None,
    on: str | None = None,
    threat: str | None = None,
    attackers: list[int] | None = None,
    victim: int | None = None,
    candidates: int | None = None,
    population: int = 256,
    confidence: float = 0.95,
    seed: int = 0,
    out: str | Path | None = None,
    progress: bool = True,
    adversary: Adversary | None = None,
) -> MembershipResult:
    """Model-level membership inference on ``run`` (module docstring): ``attack`` is the
    headline, a registered membership attack (:mod:`privaudit.eval.membership_attacks`:
    ``loss`` needs no reference runs; ``lira`` and ``rmia`` train ``references`` of them,
    cached, and report the scores of every attack those serve). ``on``: ``message`` (the
    victim's ``target`` message of ``round``, default the last round) or ``final`` (the
    run's final average model; the default where the target's kind is not a model). Writes
    ``result.json`` and ``roc.png`` to ``out`` when given; ``adversary`` (or ``threat``,
    ``attackers``, ``victim``): who observes the message (one victim). Returns the result."""
    one = None if victim is None else [victim]
    adv = Adversary.of(adversary, threat=threat, attackers=attackers, victims=one)
    adv.victim()  # one victim, or the default
    need = attacks.declared(attack).references
    attacks.check_references(attack, references)
    tgt = Target.of(target)
    target = tgt.name  # the name, in what is written
    on, t = attacked_round(run, tgt, target, on, round)
    flat, v, dst, seen_by = attacked_model(run, tgt, on, t, adv, progress)
    cands = draw_candidates(run, v, candidates, population, seed)
    game = draw_game(run, cands, seed)
    kind = tgt.kind if on == "message" else None
    played = game_model(run, v, cands, game, until=t, kind=kind, receiver=dst, progress=progress)
    refs = None
    if need is not None:
        refs = reference_models(
            run,
            v,
            cands,
            references,
            until=t,
            kind=kind,
            receiver=dst,
            seed=seed,
            progress=progress,
        )
    scores = model_scores(run, played.model, cands, refs)
    natural = model_scores(run, flat, cands, refs)
    delta = run.cfg.delta
    bound, reason = model_bound(run, tgt, on, v, t)
    finite = math.isfinite(bound)
    table = _table(scores, game.member, confidence)
    plain = _table(natural, cands.member, confidence)
    head = headline(attack, scores)
    one_run = M.pair_audit(*game.split(scores[head]), delta, confidence, seed=seed)
    lo = one_run["epsilon"]
    result: dict[str, Any] = {
        "target": target,
        "attack": attack,
        "score": head,
        "on": on,
        "round": t,
        "victim": v,
        "receiver": dst,
        "threat": seen_by,
        "members": int(game.member.sum()),
        "nonmembers": int((~game.member).sum()),
        "auc": table[head]["auc"],
        "tpr_at_fpr": table[head]["tpr_at_fpr"],
        "scores": table,
        "natural": natural_record(cands, plain, head),
        "epsilon": bound if finite else None,
        "epsilon_reason": None if finite else reason,
        "epsilon_rounds": t,
        "delta": delta,
        "epsilon_lo": lo,
        "epsilon_lo_analysis": {
            "method": ONE_RUN,
            "trials": one_run["pairs"],
            "guesses": one_run["guesses"],
            "correct": one_run["correct"],
            "reason": None,
        },
        "refuted": bool(lo > bound) if finite else None,
        "confidence": confidence,
        "tradeoff": tradeoff(*game.split(scores[head]), confidence),
        **provenance(run, v, cands, game, played, refs, references),
        "run": str(run.dir.path),
    }
    if out is not None:
        _write(Path(out), result, scores, natural, game, cands)
    return MembershipResult.from_dict(result)


def _write(
    out: Path,
    result: dict[str, Any],
    scores: dict[str, np.ndarray],
    natural: dict[str, np.ndarray],
    game: Game,
    cands: Candidates,
) -> None:
    """:func:`model_mia`'s files in ``out``: every candidate's scores, whether the victim
    trained on it, and the game's pairing (``scores.csv``), ``result.json`` and the ROC."""
    write_columns(out / "scores.csv", {"member": game.member, **scores})
    result["scores_file"] = "scores.csv"
    write_json(out / "result.json", to_jsonable(result))
    plot_game(result, scores, natural, game.member, cands.member, out / "roc.png")
    result["figure"] = str(out / "roc.png")


def headline(attack: str, scores: dict[str, np.ndarray]) -> str:
    """The score ``attack`` is judged by, which the call must have computed (RMIA scores
    nothing without population examples)."""
    head = attacks.declared(attack).headline
    if head not in scores:
        raise PrivauditError(
            f"--attack {attack}: its score {head!r} was not computed here (RMIA needs "
            "population examples apart from the candidates); pass a larger --population, or "
            "a run with a larger test split"
        )
    return head


def natural_record(cands: Any, plain: dict[str, Any], head: str) -> dict[str, Any]:
    """The shard-vs-test split on the run's own model, labelled: a train/test shift raises
    it as membership does, so no ε bound or violation rests on it."""
    return {
        "what": "the run's own model: members of the victim's shard against test-split "
        "non-members; a train/test shift raises it as membership does, so no ε bound or "
        "violation rests on it",
        "members": int(cands.member.sum()),
        "nonmembers": int((~cands.member).sum()),
        "auc": plain[head]["auc"],
        "tpr_at_fpr": plain[head]["tpr_at_fpr"],
        "scores": plain,
    }


def provenance(
    run: Run,
    v: int,
    cands: Any,
    game: Any,
    played: Any,
    refs: Any,
    references: int,
) -> dict[str, Any]:
    """What a model-level result rests on, to reproduce or check it: the game's pairs and
    coins, the candidates drawn from the victim's shard and the test split, and the
    reference runs (None for ``loss``)."""
    return {
        "game": {
            "pairs": [[int(cands.pool[a]), int(cands.pool[b])] for a, b in game.pairs],
            "members": cands.pool[game.member].tolist(),
            "seed": run.cfg.seed,
            "trained": played.trained,
            "seconds": played.seconds,
            "path": str(played.path),
        },
        "split": {
            "victim": v,
            "members": cands.members.tolist(),
            "nonmembers_test": (cands.nonmembers - cands.n_train).tolist(),
            "known_members": len(cands.known),
            "population": len(cands.population),
            "other_agents": "their shards of the run, in the game and every reference run",
        },
        "references": None
        if refs is None
        else {
            "count": references,
            "seeds": refs.seeds,
            "inside": [np.flatnonzero(row).tolist() for row in refs.inside],
            "batched": run.defense.union_exact,
            "trained": refs.trained,
            "seconds": refs.seconds,
            "path": str(refs.path),
        },
    }


def attacked_round(
    run: Run, tgt: Target, target: str, on: str | None, round: int | None
) -> tuple[str, int]:
    """Which model ``model_mia`` attacks: ``on`` (``message`` where the target's kind is a
    model, else ``final``) and its round, each checked with one line naming the fix."""
    tgt.check_run(run, 1)
    on = on or ("message" if tgt.kind in MODEL_KINDS else "final")
    if on not in ON:
        raise PrivauditError(f"--on must be one of {', '.join(ON)}, got {on!r}")
    if on == "message" and tgt.kind not in MODEL_KINDS:
        raise PrivauditError(
            f"--on message needs a message that carries a model; {target} sends "
            f"{tgt.kind!r}: use --on final (the run's final average model) or a "
            f"{tgt.defense.name}-model / -half-model target"
        )
    T = run.cfg.rounds
    if on == "final":
        if round is not None and round != T:
            raise PrivauditError(
                f"--round {round} with --on final: the final model is of round {T}; drop "
                "--round, or attack a message with --on message"
            )
        return on, T
    t = T if round is None else round
    tgt.check_run(run, t)
    return on, t


def attacked_model(
    run: Run, tgt: Target, on: str, t: int, adversary: Adversary, progress: bool
) -> tuple[Tensor, int, int | None, str]:
    """The model attacked (flat), the victim, the receiver of its message (None for the
    final model) and who sees it: the victim's model message of round ``t`` as
    ``adversary`` sees it (:func:`observed_model`), or the run's final average model."""
    if on == "message":
        return observed_model(run, tgt, t, adversary)
    v = adversary.victims_of(run.cfg.agents)[0]
    if not 0 <= v < run.cfg.agents:
        raise PrivauditError(f"--victim {v} is not an agent (0..{run.cfg.agents - 1})")
    flat = run.train(progress=progress)["x"].mean(0).float().cpu()
    return flat, v, None, "anyone: the final average model is the run's output"


def model_bound(run: Run, tgt: Target, on: str, v: int, t: int) -> tuple[float, str]:
    """The ε a membership of the attacked model is bounded by, and why where ∞: the
    victim's ε over the run for the final model, the kind's over ``t`` rounds for a
    message (every kind is post-processing of the releases counted)."""
    if on == "final":
        reason = run.resolved.get("epsilon_reason") or "no formal guarantee"
        return float(run.resolved["agents"][v]["epsilon"]), reason
    privacy = tgt.privacy(run, v)
    q = run.resolved["agents"][v]["sample_rate"]
    eps = account(privacy, run.cfg.delta, q, t, run.cfg.accountant)["run"]
    return float(eps), privacy.reason


def plot_game(
    result: dict[str, Any],
    scores: dict[str, np.ndarray],
    natural: dict[str, np.ndarray],
    member: np.ndarray,
    natural_member: np.ndarray,
    path: Path,
) -> None:
    """The ROC of every score in the game, the headline's natural split beside them, and
    the DP region of the bound where it is finite."""
    head, table, plain = result["score"], result["scores"], result["natural"]["scores"]
    curves = {
        f"{name} (AUC {table[name]['auc']:.3f})": M.roc(s[member], s[~member])
        for name, s in scores.items()
    }
    nat = natural[head]
    curves[f"natural {head} (AUC {plain[head]['auc']:.3f})"] = M.roc(
        nat[natural_member], nat[~natural_member]
    )
    where = f"round {result['round']}" if result["on"] == "message" else "final average model"
    refs = result["references"]["count"] if result["references"] else 0
    bound = result["epsilon"]
    M.plot_roc(
        curves,
        path,
        bound=(bound, result["delta"]) if bound is not None else None,
        title=f"{result['threat']} · {result['target']} · {where} · game · {refs} references",
    )


def _table(scores: dict[str, np.ndarray], member: np.ndarray, confidence: float) -> dict[str, Any]:
    """Per score: AUC and TPR at :data:`FPRS` of ``member`` against the rest."""
    table: dict[str, Any] = {}
    for name, s in scores.items():
        s_in, s_out = s[member], s[~member]
        table[name] = {
            "auc": M.auc(s_in, s_out),
            "tpr_at_fpr": {
                f"{f:g}": _point(M.tpr_at_fpr(s_in, s_out, f, confidence)) for f in FPRS
            },
        }
    return table


def _point(obj: Any) -> dict[str, float | bool]:
    return {
        k: v if isinstance(v, bool) else float(v)
        for k, v in ((k, getattr(obj, k)) for k in obj.__dataclass_fields__)
    }
