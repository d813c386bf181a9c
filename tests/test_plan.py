"""The observation planner itself (:mod:`privaudit.sim.plan`): its defaults for the victim and
the adversary, the copy each adversary attacks, the order in which threat models are tried,
and :func:`locate`'s observations — each checked against the graph, not against the code."""

from __future__ import annotations

import pytest
from conftest import tiny

from privaudit.api.pipeline import observe
from privaudit.core.errors import PrivauditError, Unobservable
from privaudit.core.threat import THREATS
from privaudit.experiments.audit import audit
from privaudit.sim import plan
from privaudit.sim.run import Run
from privaudit.sim.targets import Target

TARGET = "dsgd-half-model"  # gossiped to every neighbour each round, in the clear


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A tiny D-SGD run on the ring of 4: agent i's neighbours are i ± 1 mod 4."""
    return Run.create(tiny("dsgd"), tmp_path_factory.mktemp("plan") / "r")


def ring_neighbours(i: int) -> set[int]:
    return {(i - 1) % 4, (i + 1) % 4}


def test_the_default_victim_is_the_first_agent_that_is_not_an_attacker():
    assert plan.default_victim(4) == 0
    assert plan.default_victim(4, [0, 1]) == 2
    assert plan.default_victim(4, [1]) == 0


def test_threat_models_are_tried_weakest_first_unless_named_or_implied():
    Adversary = plan.Adversary
    searched = Adversary().threats()
    assert searched == ["link", "neighbor", "global"]  # the module's stated order
    assert set(searched) == {n for n in THREATS if THREATS[n].searched}
    assert Adversary(attackers=(2,)).threats() == ["neighbor"]
    assert Adversary(attackers=(1, 3)).threats() == ["coalition"]
    assert Adversary("global", attackers=(1, 3)).threats() == ["global"]  # a named one wins


def test_the_adversary_is_given_once_typed_or_loose():
    Adversary = plan.Adversary
    loose = Adversary.of(threat="neighbor", attackers=[2], victims=[1, 3])
    assert loose == Adversary("neighbor", None, (2,), (1, 3))  # lists become tuples
    assert Adversary.of(loose) is loose
    with pytest.raises(PrivauditError, match="give the adversary once"):
        Adversary.of(loose, threat="global")
    assert Adversary(victims=(3,)).victim() == 3 and Adversary().victim() is None
    with pytest.raises(PrivauditError, match="one victim"):
        Adversary(victims=(1, 3)).victim()
    assert Adversary(attackers=(0, 1)).victims_of(4) == [2]  # the default victim


def test_each_adversary_attacks_a_copy_it_receives(run):
    target = Target.parse(TARGET)
    (link,) = plan.sightings(run, target, 1, "link", plan.Adversary())
    assert link.src == 0 and link.dst in ring_neighbours(0)  # the victim's first receiver
    assert link.threat.sees(link.src, link.dst) and link.threat.sees(link.dst, link.src)
    assert not any(link.threat.sees(0, j) for j in ring_neighbours(0) - {link.dst})

    # one attacker, victims on either side of it: each victim's copy to agent 2
    two = plan.Adversary(attackers=(2,), victims=(1, 3))
    seen = plan.sightings(run, target, 1, "neighbor", two)
    assert [(s.src, s.dst) for s in seen] == [(1, 2), (3, 2)]

    # named links: one link adversary per link, as named
    named = plan.sightings(run, target, 1, "link", plan.Adversary(links=((1, 0), (3, 2))))
    assert [(s.src, s.dst) for s in named] == [(1, 0), (3, 2)]
    assert [s.threat.sees(s.src, s.dst) for s in named] == [True, True]
    assert not named[0].threat.sees(3, 2)


def test_an_adversary_that_receives_nothing_from_the_victim_is_unobservable(run):
    target = Target.parse(TARGET)
    with pytest.raises(Unobservable, match="receive no"):  # agent 2 is not 0's neighbour
        plan.sightings(run, target, 1, "neighbor", plan.Adversary(attackers=(2,), victims=(0,)))
    with pytest.raises(Unobservable, match="one of the attackers"):
        plan.sightings(run, target, 1, "neighbor", plan.Adversary(attackers=(2,), victims=(2,)))


def test_the_next_threat_model_is_tried_only_after_an_unobservable_message():
    tried = []

    def attempt(name: str) -> str:
        tried.append(name)
        if name != "global":
            raise Unobservable(f"{name} sees nothing")
        return name

    assert plan.first_observable("t", 3, ["link", "neighbor", "global"], attempt) == "global"
    assert tried == ["link", "neighbor", "global"]

    with pytest.raises(Unobservable, match="link sees nothing") as one:
        plan.first_observable("t", 3, ["link"], attempt)  # one threat: its own error
    assert "no adversary" not in str(one.value)
    with pytest.raises(Unobservable, match=r"no adversary observes t at round 3 \(neighbor:"):
        plan.first_observable("t", 3, ["link", "neighbor"], attempt)

    def broken(name: str) -> str:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):  # only Unobservable moves on
        plan.first_observable("t", 3, ["link", "neighbor"], broken)


def test_locate_names_each_observation_and_holds_the_message_the_victim_sent(run):
    (sighting, obs) = plan.locate(run, TARGET, 2, progress=False)[0]
    assert obs.meta["target"] == TARGET and obs.meta["round"] == 2
    assert (obs.meta["src"], obs.meta["dst"]) == (sighting.src, sighting.dst)
    assert obs.meta["threat"] == sighting.threat.describe()
    assert sighting.threat.name == "link"  # the weakest adversary that observes it

    # one named attacker: a neighbour; two: a coalition, each victim seen by a member
    ((s1, o1),) = plan.locate(run, TARGET, 2, attackers=[1], progress=False)
    assert s1.threat.name == "neighbor" and (o1.meta["src"], o1.meta["dst"]) == (0, 1)
    both = plan.locate(run, TARGET, 2, attackers=[1, 3], victims=[0, 2], progress=False)
    assert [p.threat.name for p, _ in both] == ["coalition", "coalition"]
    typed = plan.Adversary(attackers=(1, 3), victims=(0, 2))  # the same, typed
    assert [(p.src, p.dst) for p, _ in plan.locate(run, TARGET, 2, typed, progress=False)] == [
        (p.src, p.dst) for p, _ in both
    ]
    assert all(p.dst in {1, 3} and p.dst in ring_neighbours(p.src) for p, _ in both)

    # the same message from two receivers' copies: D-SGD sends one half-model to everyone
    a = plan.locate(run, TARGET, 2, links=[(0, 1)], progress=False)[0][1]
    b = plan.locate(run, TARGET, 2, links=[(0, 3)], progress=False)[0][1]
    for (pa, _, _), (pb, _, _) in zip(a.terms, b.terms, strict=True):
        assert (pa - pb).abs().max().item() == 0


def test_only_named_attackers_made_of_agents_reach_past_their_links():
    def beyond(threat: str | None, attackers, links=None) -> bool:
        return plan.Adversary.of(threat=threat, attackers=attackers, links=links).reaches_beyond()

    assert beyond(None, [2]) and beyond(None, [1, 3])
    assert beyond("coalition", [1, 3]) and beyond("neighbor", [2])
    assert not beyond(None, None) and not beyond(None, [])
    assert not beyond("link", [2]) and not beyond("global", [2])
    assert not beyond(None, [2], links=[(0, 1)])  # named links: those copies
    # the threat models' own declaration decides, so a plugin's answers for itself
    assert {n for n in THREATS if beyond(n, [1])} == {
        n for n in THREATS if THREATS[n].uses_attackers
    }


def test_a_target_parsed_by_the_command_is_not_parsed_again_below_it(run, monkeypatch):
    """A command parses ``--target`` once and hands the Target down: the planner, the
    observation and the audit take it as is (and write its name)."""
    tgt = Target.parse(TARGET)

    def again(cls: type, name: str) -> Target:
        raise AssertionError(f"{name} parsed again")

    monkeypatch.setattr(Target, "parse", classmethod(again))
    ((_, obs),) = plan.locate(run, tgt, 2, progress=False)
    (seen,) = observe(run, tgt, 2, progress=False)
    assert obs.meta["target"] == seen.meta["target"] == TARGET
    result = audit(run, tgt, trials=64, progress=False).to_dict()
    assert result["target"] == TARGET and isinstance(result["target"], str)
