"""The threat-model contract and its registry: what every adversary knows (:class:`Public`),
what one sees (:class:`View`), the :class:`Threat` base a threat model subclasses,
:func:`register_threat` and the helpers every command uses to build one. The package
docstring lists the built-ins."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from privaudit.core.errors import NameTaken, PrivauditError, Unobservable, unknown
from privaudit.core.extensions import calling, failure

if TYPE_CHECKING:
    from torch import Tensor

Key = tuple[int, int, int, str]


@dataclass(frozen=True)
class Public:
    """What every adversary knows about a run (never a secret): the defense and its
    parameters (``params``: its ``-p`` values, e.g. ``params["lr"]``, ``params["sigma"]``),
    the architecture and data shapes, the graph's mixing matrix ``W`` over ``n`` agents, the
    shared initial model ``x0``, the expected batch size B and the run's (ε, δ)."""

    defense: str
    model: str
    input_shape: tuple[int, ...]
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    batch_size: int
    W: Tensor
    n: int
    x0: Tensor
    params: dict[str, Any]
    epsilon: float
    delta: float

    def __getitem__(self, key: str) -> Any:
        """The dict form of an earlier release (``public["params"]``), kept for plugins
        written against it: the same value as the attribute, with a DeprecationWarning that
        names the attribute to use instead."""
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        warnings.warn(
            f'view.public["{key}"] is deprecated: use view.public.{key} (privaudit.core.threat'
            ".Public, docs/extending.md)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        """``public.get(key)`` of the dict form (deprecated, as :meth:`__getitem__`)."""
        return self[key] if key in self.__dataclass_fields__ else default


@dataclass
class View:
    """What one adversary sees: messages keyed ``(round, src, dst, kind)`` and public facts."""

    threat: str
    messages: dict[Key, Tensor]
    public: Public
    _sent: dict[tuple[int, int, str], Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for (t, s, _, k), v in self.messages.items():
            self._sent.setdefault((t, s, k), v)

    def get(self, t: int, src: int, dst: int, kind: str) -> Tensor:
        key = (t, src, dst, kind)
        if key not in self.messages:
            raise Unobservable(
                f"the {self.threat} adversary does not see the {kind!r} message {src}->{dst} "
                f"of round {t}; an adversary that does: --threat neighbor --attacker {dst}, "
                "or --threat global"
            )
        return self.messages[key]

    def has(self, t: int, src: int, dst: int, kind: str) -> bool:
        return (t, src, dst, kind) in self.messages

    def sent(self, t: int, src: int, kind: str) -> Tensor | None:
        """A ``kind`` message ``src`` sent in round ``t`` on any link the View holds, or None.

        Only meaningful for *broadcast* kinds (one payload on every out-link: models,
        momenta, tracking variables); per-link kinds (``cg``, ``noise``) use :meth:`get`."""
        return self._sent.get((t, src, kind))


@dataclass(frozen=True)
class Threat:
    """One adversary: a registered threat model (its ``name``) and who it is (``agents``
    for the agent-based models, ``link`` for ``link``).

    Contract of a threat model (a subclass under :func:`register_threat`; a plugin may add
    one): ``name`` (what ``--threat`` takes), ``strength`` (its place from weakest to
    strongest), ``summary`` (one line for ``--help``), ``uses_attackers`` (``--attacker``
    names its members), ``searched`` (tried when no ``--threat`` is given, weakest first),
    :meth:`sees` (whether the directed link ``src → dst`` is in its View), :meth:`build`
    (from the command line's ``--link`` / ``--attacker``) and :meth:`for_victim` (the
    default adversary of one victim's message)."""

    agents: frozenset[int] = frozenset()
    link: tuple[int, int] | None = None

    name: ClassVar[str]
    strength: ClassVar[int] = 100
    summary: ClassVar[str] = ""
    uses_attackers: ClassVar[bool] = True
    searched: ClassVar[bool] = False

    def __init_subclass__(cls, **kw: Any) -> None:
        """Guard the :data:`HOOKS` a subclass defines (see the module docstring)."""
        super().__init_subclass__(**kw)
        for hook in HOOKS:
            if hook in cls.__dict__:
                setattr(cls, hook, _guarded(cls.__dict__[hook], hook))

    def sees(self, src: int, dst: int) -> bool:
        return src in self.agents or dst in self.agents

    @classmethod
    def build(cls, *, link: tuple[int, int] | None = None, attackers: Iterable[int] = ()) -> Threat:
        """The adversary named on the command line."""
        agents = frozenset(attackers)
        if not agents:
            raise PrivauditError(f"--threat {cls.name} needs its members: --attacker A,B,...")
        return cls(agents)

    @classmethod
    def for_victim(cls, victim: int, receivers: list[int], attackers: Iterable[int]) -> Threat:
        """The adversary that attacks ``victim``'s message when no link is named (the
        defaults of every command); ``receivers``: who gets the message from the victim."""
        return cls.build(attackers=attackers)

    def links(self, edges: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
        """The directed links of the graph this adversary taps."""
        return {e for e in edges if self.sees(*e)}

    def view(self, messages: dict[Key, Tensor], public: Public) -> View:
        seen = {k: v for k, v in messages.items() if self.sees(k[1], k[2])}
        return View(self.name, seen, public)

    def receiver(self, victim: int, receivers: list[int], what: str) -> int:
        """The agent whose incoming copy of the victim's message this adversary attacks:
        the first receiver whose copy it sees (the link's other end, the attacker, the first
        coalition member that receives it). ``receivers``: who gets ``what`` from the
        victim; ``what`` names it in errors."""
        if victim in self.agents:
            raise Unobservable(
                f"agent {victim} is one of the attackers; choose a --victim outside "
                f"{sorted(self.agents)}"
            )
        if not receivers:
            raise Unobservable(f"agent {victim} sends no {what}; pick another round or victim")
        pool = [b for b in receivers if self.sees(victim, b)]
        if not pool:
            raise Unobservable(
                f"{self.who()} receive no {what} from agent {victim}; it goes to "
                f"{', '.join(map(str, receivers))}: e.g. --threat neighbor --attacker "
                f"{receivers[0]}, or --threat global"
            )
        return pool[0]

    def who(self) -> str:
        """The adversary in an error line."""
        return f"agent(s) {sorted(self.agents)}"

    def describe(self) -> str:
        return f"{self.name} {','.join(map(str, sorted(self.agents)))}"


# the methods a threat model may define, guarded when a subclass defines them
HOOKS = ("sees", "build", "for_victim", "who", "describe")


def _guarded(member: Any, hook: str) -> Any:
    """``member`` (a subclass's method or classmethod ``hook``) run under
    :func:`~privaudit.core.extensions.calling`; ``sees`` must answer a bool."""
    if isinstance(member, classmethod):
        fn = member.__func__

        @functools.wraps(fn)
        def on_class(cls: type[Threat], *args: Any, **kw: Any) -> Any:
            name = getattr(cls, "name", cls.__name__)
            with calling("threat", name, cls, f"{hook}()"):
                return fn(cls, *args, **kw)

        return classmethod(on_class)
    if not callable(member):
        return member
    method: Callable[..., Any] = member

    @functools.wraps(method)
    def on_instance(self: Threat, *args: Any, **kw: Any) -> Any:
        cls = type(self)
        name = getattr(cls, "name", cls.__name__)
        with calling("threat", name, cls, f"{hook}()"):
            out = method(self, *args, **kw)
        if hook == "sees" and not isinstance(out, bool):
            raise failure(
                "threat",
                name,
                cls,
                "sees()",
                f"answered {out!r} for the link {args[0] if args else '?'}→"
                f"{args[1] if len(args) > 1 else '?'}, not True or False",
                "return True or False from sees(src, dst)",
            )
        return out

    return on_instance


THREATS: dict[str, type[Threat]] = {}
T = TypeVar("T", bound=type[Threat])


def register_threat(cls: T) -> T:
    """Class decorator: register a :class:`Threat` subclass under its ``name`` (frozen
    dataclass: decorate it with ``@dataclass(frozen=True)`` too if it adds fields)."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name or not name.replace("-", "").isalnum():
        raise PrivauditError(
            f"threat model {cls.__name__} needs a name (a class attribute, a word like 'link')"
        )
    if name in THREATS and THREATS[name] is not cls:
        raise NameTaken("threat", name)
    THREATS[name] = cls
    return cls


def threat_names() -> list[str]:
    """The registered threat models, weakest first."""
    return sorted(THREATS, key=lambda n: THREATS[n].strength)


def get_threat(name: str) -> type[Threat]:
    if name not in THREATS:
        raise unknown("threat model", name, threat_names())
    return THREATS[name]


def threat_help() -> str:
    """``--threat``'s help: the registered threat models, weakest first."""
    return " | ".join(threat_names())


def parse_link(text: str, edges: list[tuple[int, int]]) -> tuple[int, int]:
    """``"SRC,DST"`` → a directed edge of the graph, or one clear error."""
    try:
        src, dst = (int(s) for s in text.split(","))
    except ValueError:
        raise PrivauditError(f"--link must be SRC,DST (two agent ids), got {text!r}") from None
    if (src, dst) not in edges:
        near = ", ".join(f"{s},{d}" for s, d in edges[:6])
        raise PrivauditError(
            f"--link {src},{dst} is not a link of the topology; links are e.g. {near}"
        )
    return src, dst


def parse_links(texts: Iterable[str], edges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Every ``--link`` as a directed edge (:func:`parse_link`); a link named twice is an
    error (it would be attacked and counted twice)."""
    links = [parse_link(text, edges) for text in texts]
    twice = sorted({link for link in links if links.count(link) > 1})
    if twice:
        names = " ".join(f"--link {s},{d}" for s, d in twice)
        raise PrivauditError(f"{names} is given more than once; name each link once")
    return links


def build_threat(
    name: str,
    *,
    link: tuple[int, int] | None = None,
    attackers: Iterable[int] = (),
) -> Threat:
    """A :class:`Threat` from its registered name and what it needs: ``link`` for ``link``,
    one attacker for ``neighbor``, one or more for ``coalition``."""
    return get_threat(name).build(link=link, attackers=attackers)


def victim_threat(
    name: str, victim: int, receivers: list[int], attackers: Iterable[int] = ()
) -> Threat:
    """The adversary that attacks ``victim``'s message when no link is named, with the
    defaults of every command (:meth:`Threat.for_victim`): ``link`` taps the link to the
    first receiver; ``neighbor`` without ``attackers`` is the first receiver, ``coalition``
    without them every receiver. ``receivers``: who gets the message from the victim."""
    return get_threat(name).for_victim(victim, receivers, attackers)
