"""The claims ledger as text: ``OUT/claims.md`` (Markdown) and the table ``privaudit claims``
prints, both read from the ledger document (:mod:`privaudit.experiments.claims`), which
holds every number and verdict shown; nothing here computes one.

Both show what a reader needs to judge a claim without the JSON:

- the setting in one paragraph (:func:`describe`): the configuration, each defense's σ and
  topology, and the power of the evidence — each row's trials, whether its canary search
  ran, the confidence and the Bonferroni recheck of violations — since a verdict means
  nothing without the audit behind it;
- the findings in a few lines (:func:`headline`): claims the evidence refutes, claims that
  do not apply because the run does not enforce their assumption, finite claims for kinds
  with no formal guarantee, paper accountings below a correct one, and accounted bounds the
  evidence violates (a bug in the accounting if any);
- a row per message kind (:data:`COLUMNS`, :func:`cells`): the promise, the truth and the
  evidence side by side, then the two verdicts. A row audited with less power than the
  ledger's best says so in its audit cell (:func:`power_notes`), and a "loose" verdict whose
  lower bound is 0 reads "no evidence" (:func:`claim_text`): it shows nothing, not a leak
  smaller than promised;
- numbered notes for what does not fit a cell (:class:`Notes`): the paper's claim in full
  (P), why a kind has no formal guarantee (R), why a row could not be audited (E);
- with ``--final-model`` only, a last column (:data:`FINAL_COLUMN`, :func:`final_cell`): each
  defense's final-model audit on every row of it, its setting in the setting line and its
  findings in the headline; without it, the text is what it was before the column existed.

The Markdown keeps every cell on one line and explains each column (:data:`LEGEND`); the
terminal table drops the Markdown emphasis, wraps long cells (:data:`TERMINAL_WIDTHS`) to
stay about 170 characters wide, and puts the findings after the rows.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

from privaudit.core.text import sig

# the table's columns, in order (:func:`cells` fills a row's); :data:`LEGEND` says what each shows
COLUMNS = (
    "target",
    "paper's claim",
    "claimed ε, run",
    "claimed ε, release: count",
    "claimed ε, release: rule",
    "accounted ε, run",
    "accounted ε, release",
    "audit ε ≥, release",
    "real example ε ≥",
    "claim",
    "accounting",
)
# the terminal table's widest lines per column (privaudit claims' stdout): longer cells wrap
TERMINAL_WIDTHS = (None, 20, 10, 10, 10, 10, 10, 16, 12, 30, 12)
# the column of a ledger with the final-model audits (privaudit claims --final-model), last
FINAL_COLUMN = "final models ε ≥"
FINAL_WIDTH = 18

LEGEND = [
    "- **paper's claim**: the paper's privacy statement, abridged (full text in the P-notes).",
    "- **claimed ε, run**: the ε the paper's own accounting (its noise multiplier and its "
    "count of releases per round) gives over the run, worst agent.",
    "- **claimed ε, release: count**: the paper's accounting for the one release the audit "
    "observes (its noise multiplier; sample rate 1).",
    "- **claimed ε, release: rule**: the paper's own σ(ε) rule for that release (or round), "
    "where it states one (stated in Δf: evaluated at the canary's change of the message).",
    "- **accounted ε, run**: the correct ε over the run at the calibrated σ (add/remove one "
    "example, Poisson sampling q_i = B/n_i, every release of the batch composed), worst "
    "agent; ∞ when the kind has no formal guarantee (why: the R-notes).",
    "- **accounted ε, release**: the correct ε of that one release (sample rate 1).",
    "- **audit ε ≥, release**: the white-box audit's ε lower bound for that release "
    "(Clopper–Pearson, or Gaussian DP for Gaussian channels); capped: at the most the trial "
    "count can show, more trials raise it; rechecked: the bound of the second audit a "
    "violation triggers (see Setting); N trials: a costly kind's fixed share of --trials; no "
    "search, k canaries: the audit searched fewer canary candidates than the ledger's best "
    "rows (fewer trials; see Setting).",
    "- **real example ε ≥**: the same audit with a real training example under its own "
    "label as the canary (the input-space audit: membership of real data, which no one "
    "crafted to be found), for every kind with a formal guarantee; as many trials; "
    "violated = above the accounted ε for one release.",
    "- **claim**: the lower bound against the claimed ε for one release (count and rule; "
    "the more severe verdict); violated = the evidence refutes the claim; no claim = the "
    "paper promises nothing finite; otherwise consistent, loose or no evidence as for the "
    "accounting. A claim that rests on an assumption the run does not enforce (a bound G on "
    "every per-example gradient norm: the R-note says which) is judged on the canaries of "
    "norm ≤ G: beaten by one of those it is violated; beaten only by canaries of norm > G, "
    '"assumption not enforced in this run: the claim does not apply", with the strongest '
    "of them (measured) and the verdict of the canaries of norm ≤ G.",
    "- **accounting**: the lower bound against the accounted ε for one release; consistent "
    "(lower bound ≥ half the upper bound), loose (above 0 but below half: some leak shown, "
    "less than the bound allows; more trials or a stronger adversary could tighten it), no "
    "evidence (lower bound 0: the trials showed nothing), no guarantee (∞), violated (a bug "
    "in the accounting).",
]
FINAL_LEGEND = (
    "- **final models ε ≥** (`--final-model`): the final-model audit of the row's defense, "
    "the same on each of its rows. Its adversary sees only the final models after the last "
    "round (the hidden-state threat model of Cebere et al., ICLR 2025: one neighbour's model, "
    "see Setting) and plants a crafted gradient canary, a Dirac of the clip of the defense's "
    "first formal kind (else its first kind), in the victim's update in every round. Shown: "
    "its ε lower bound (capped: at the most the trial count can show), against the accounted "
    "ε of the mechanism it ran — every release of the victim in those rounds composed at "
    "sample rate 1 (PRV; the canary joins every round, so sampling amplifies nothing; ∞ when "
    "a kind of the defense has no formal guarantee) — and the verdict as for the accounting "
    "(also violated where the trade-off curve's μ lower bound beats the accounted μ)."
)


# -- the whole ledger ------------------------------------------------------------------------------
def markdown(doc: dict[str, Any]) -> str:
    """The ledger as markdown: setting, headline, table, legend, notes."""
    claims, reasons, errors = Notes("P"), Notes("R"), Notes("E")
    body = _body(doc, claims, reasons, errors)
    heads = columns(doc)
    lines = ["# Claims ledger", ""]
    if not doc.get("complete", True):
        done = len(doc["rows"])
        lines += [f"**Partial: {done} row{'s' * (done != 1)} done; rerun to finish.**", ""]
    lines += [
        "The promise (the paper's claim), the truth (a correct accounting) and the evidence "
        "(a white-box canary audit) for every defense and message kind, written by "
        "`privaudit claims`.",
        "",
        f"Setting: {describe(doc)}",
        "",
        *headline(doc),
        "",
        "| " + " | ".join(heads) + " |",
        "|" + "|".join("---" for _ in heads) + "|",
        *("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body),
        "",
        "Columns:",
        "",
        *LEGEND,
        *([FINAL_LEGEND] if "final_model" in doc else []),
        "",
        "Paper claims:",
        "",
        *claims.lines(),
        "",
    ]
    if reasons.texts:
        lines += ["Why ∞ (no formal guarantee):", "", *reasons.lines(), ""]
    if errors.texts:
        lines += ["Not audited:", "", *errors.lines(), ""]
    return "\n".join(lines)


def table(doc: dict[str, Any]) -> str:
    """The ledger for a terminal: setting, table, headline, notes (plain text). Cells longer
    than their column's :data:`TERMINAL_WIDTHS` wrap onto more lines, so the table stays
    about 170 characters wide; the markdown keeps each cell on one line."""
    claims, reasons, errors = Notes("P"), Notes("R"), Notes("E")
    body = [
        [c.replace("**", "").replace("`", "") for c in row]
        for row in _body(doc, claims, reasons, errors)
    ]
    most = TERMINAL_WIDTHS + ((FINAL_WIDTH,) if "final_model" in doc else ())
    grid = [
        [_wrap(c, w) for c, w in zip(cs, most, strict=True)] for cs in [list(columns(doc)), *body]
    ]
    widths = [max(len(x) for cell in col for x in cell) for col in zip(*grid, strict=True)]

    def lines(cs: list[list[str]]) -> list[str]:
        return [
            "  ".join(
                (c[i] if i < len(c) else "").ljust(w) for c, w in zip(cs, widths, strict=True)
            ).rstrip()
            for i in range(max(len(c) for c in cs))
        ]

    rule = "  ".join("-" * w for w in widths)
    out = [f"claims ledger · {describe(doc)}", "", *lines(grid[0]), rule]
    out += [x for cs in grid[1:] for x in lines(cs)]
    out += ["", *[h[2:].replace("`", "") for h in headline(doc)], ""]
    for title, notes in (("paper claims", claims), ("why ∞", reasons), ("not audited", errors)):
        if notes.texts:
            out.append(f"{title}:")
            out += [f"  {ref}  {text}" for text, ref in notes.texts.items()]
    return "\n".join(out)


def columns(doc: dict[str, Any]) -> tuple[str, ...]:
    """The table's columns: :data:`COLUMNS`, and :data:`FINAL_COLUMN` last where the ledger
    has the final-model audits."""
    return COLUMNS + ((FINAL_COLUMN,) if "final_model" in doc else ())


def _body(doc: dict[str, Any], claims: Notes, reasons: Notes, errors: Notes) -> list[list[str]]:
    """Every row's cells (:func:`cells`), with its defense's final-model cell
    (:func:`final_cell`) where the ledger has the column."""
    body = [cells(r, claims, reasons, errors, doc["setting"]) for r in doc["rows"]]
    if "final_model" in doc:
        finals = doc["final_model"]
        for r, cs in zip(doc["rows"], body, strict=True):
            cs.append(final_cell(finals.get(r["defense"]), errors))
    return body


def _wrap(text: str, width: int | None) -> list[str]:
    """``text`` in lines of at most ``width`` characters, cut at spaces only (a longer word
    keeps its line); one line when ``width`` is None."""
    if width is None or len(text) <= width:
        return [text]
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)


# -- the setting and the findings ------------------------------------------------------------------
def describe(doc: dict[str, Any]) -> str:
    """The setting in one paragraph."""
    s = doc["setting"]
    a = s["audit"]
    own = [f"{n}: {t}" for n, t in doc["topologies"].items() if t != s["topology"]]
    topo = s["topology"] + (f" ({', '.join(own)})" if own else "")
    if s["sigma"] is not None:
        noise = f"σ = {s['sigma']:g} (--sigma) wherever σ is a noise multiplier"
    else:
        noise = (
            f"σ calibrated so that every formal kind has ε ≤ {s['epsilon']:g} over the run "
            "(by the paper's accounting where no kind is formal)"
        )
    sig = ", ".join(f"{n} {v:.3g}" for n, v in doc["sigma"].items() if v)
    m = a.get("family", 1)
    recheck = (
        f"; a row whose bound violates a claim or the accounting is audited again on fresh "
        f"noise at {1 - (1 - a['confidence']) / m:.4g} (Bonferroni over the {m} rows), so "
        f"that the ledger's violations hold together at {a['confidence']:g}"
        if m > 1
        else ""
    )
    return (
        f"{s['agents']} agents on {topo}, {s['dataset']}, {s['model']}, B = {s['batch_size']}, "
        f"{s['rounds']} rounds, δ = {s['delta']:g}, {s['accountant']} accountant; {noise}"
        f"{f' (σ: {sig})' if sig else ''}. Adjacency: {s['adjacency']}; sampling: "
        f"{s['sampling']}; the run's ε is the worst agent's. Evidence: {a['mode']} canary "
        f"audit ({_search_text(a)}) and, for formal kinds, the same audit with a real example, "
        f"of round {a['round']}, {a['threat']} threat (victim {a['victim']} "
        f"→ its first receiver), {_trials_text(a)}, confidence "
        f"{a['confidence']:g} per row{recheck}; per-release bounds at sample rate 1 (PRV)."
        + (f" {_final_text(doc)}" if "final_model" in doc else "")
    )


def _final_text(doc: dict[str, Any]) -> str:
    """The final-model audits' setting, as the setting line states it (``--final-model``):
    the run, the adversary and the canary, the trials and the upper bound."""
    f = doc["setting"]["final_model"]
    done = doc["final_model"].values()
    sigmas = ", ".join(f"{x['defense']} {x['sigma']:.3g}" for x in done if x.get("sigma"))
    targets = ", ".join(x["target"] for x in done if x.get("target"))
    return (
        f"Final models (last column): each defense's run of {f['rounds']} rounds"
        f"{f' (σ: {sigmas})' if sigmas else ''}, the same configuration otherwise; the "
        f"hidden-state adversary reads victim {f['victim']}'s first neighbour's final model "
        "alone, and a Dirac gradient canary of the clip of the defense's first formal kind "
        f"(else its first kind{f': {targets}' if targets else ''}) joins the victim's update "
        f"in every round, on the run's own batches; {f['trials']} trials per defense, "
        f"confidence {f['confidence']:g} per defense; against the ε of those rounds' "
        "releases composed at sample rate 1 (PRV)."
    )


def _trials_text(a: dict[str, Any]) -> str:
    """Each row's trials, as the setting line states them: --trials, and the costly kinds'
    share of it (:data:`~privaudit.experiments.claims.TRIAL_DIVISORS`), naming them."""
    fewer: dict[int, list[str]] = {}
    for target, p in a["plan"].items():
        if p["trials"] != a["trials"]:
            fewer.setdefault(p["trials"], []).append(target)
    text = f"{a['trials']} trials per row"
    if fewer:
        each = "; ".join(
            f"{n} for {', '.join(ts)}" for n, ts in sorted(fewer.items(), reverse=True)
        )
        text += f" ({each}: the costly kinds run a fixed share of --trials)"
    return text


def _search_text(a: dict[str, Any]) -> str:
    """Whether each row's canary search ran, and over how many candidates, as the setting
    line states it: by trial count, with what a search needs."""
    total, needs = a["search"]["candidates"], a["search"]["needs"]
    by: dict[int, set[int]] = {}  # candidates searched -> the trial counts that search them
    for p in a["plan"].values():
        by.setdefault(p["canaries"], set()).add(p["trials"])
    parts = []
    for k in sorted(by, reverse=True):
        counts = " or ".join(str(n) for n in sorted(by[k], reverse=True))
        if k == 1:
            parts.append(
                f"no canary search with {counts} trials: the first of its kind's "
                f"{total} candidates alone"
            )
        else:
            which = "all" if k == total else f"the first {k} of the"
            parts.append(f"canary searched over {which} {total} candidates with {counts} trials")
    return (
        f"{'; '.join(parts)}; a search needs {needs['2']} trials for 2 candidates, "
        f"{needs[str(total)]} for all {total}: privaudit/experiments/audit.py"
    )


def headline(doc: dict[str, Any]) -> list[str]:
    """The findings in a few lines: claims refuted, claims that do not apply, accounting
    violations, ∞ kinds."""
    rows = doc["rows"]
    audited = [r for r in rows if r["error"] is None]
    refuted = [r["target"] for r in audited if r["claim"]["verdict"] == "violated"]
    moot = [r for r in audited if r["claim"]["verdict"] == "does not apply"]
    readings = [r["target"] for r in rows if not r.get("paper_claims", True)]
    refuted, misread = (
        [t for t in refuted if t not in readings],
        [t for t in refuted if t in readings],
    )
    broken = [
        r["target"]
        for r in audited
        if r["accounting"]["verdict"] == "violated"
        or (r.get("real") or {}).get("verdict") == "violated"
    ]
    informal = [r["target"] for r in rows if not r["formal"]]
    claimed_inf = [r for r in rows if not r["formal"] and math.isfinite(r["epsilon_claimed"])]
    under = [
        r["target"]
        for r in rows
        if r["formal"] and r["epsilon_claimed"] < r["epsilon"] * (1 - 1e-3)
    ]
    out = [
        f"- {len(rows)} message kinds of {len({r['defense'] for r in rows})} defenses; "
        f"{len(rows) - len(informal)} have a formal guarantee, {len(informal)} have none (∞).",
        "- Claims the evidence refutes (audit lower bound > the claim's ε for one release, "
        "with canaries that respect the claim's assumptions): "
        f"{_names(refuted, 'none at this setting')}.",
        "- Claims that do not apply because their assumption is not enforced in this run "
        "(only canaries that break it beat the claim; the R-notes say how to enforce it where "
        "the defense can): "
        f"{_unenforced(moot)}.",
        "- No claim in the paper, but the evidence refutes our reading of how its users "
        f"count its releases: {_names(misread, 'none at this setting')}.",
        f"- Kinds with no formal guarantee whose paper still claims a finite ε over the run: "
        f"{_names([r['target'] for r in claimed_inf])}.",
        f"- Formal kinds whose paper's accounting claims less ε than a correct one: "
        f"{_names(under)}.",
        f"- Accounted bounds the evidence violates (a bug in the accounting if any): "
        f"{_names(broken)}.",
    ]
    errs = [r["target"] for r in rows if r["error"] is not None]
    if errs:
        out.append(f"- Not audited (see the E-notes): {_names(errs)}.")
    if "final_model" in doc:
        out += _final_headline(doc["final_model"])
    return out


def _final_headline(finals: dict[str, Any]) -> list[str]:
    """The final-model audits' findings (``--final-model``): accounted bounds they violate,
    defenses with no formal guarantee whose final models they show leaking, and those they
    could not audit."""
    done = [f for f in finals.values() if f["error"] is None]
    broken = [f["defense"] for f in done if f["verdict"] == "violated"]
    leaks = [f["defense"] for f in done if math.isinf(f["upper"]) and f["epsilon_lo"] > 0]
    out = [
        "- Final models (an adversary who sees only them, a canary in every round): accounted "
        f"bounds the evidence violates (a bug in the accounting if any): {_names(broken)}; "
        "defenses with no formal guarantee whose final models leak (lower bound > 0): "
        f"{_names(leaks)}."
    ]
    errs = [name for name, f in finals.items() if f["error"] is not None]
    if errs:
        out.append(f"- Final models not audited (see the E-notes): {_names(errs)}.")
    return out


def _names(targets: list[str], none: str = "none") -> str:
    return ", ".join(f"`{t}`" for t in targets) or none


def _unenforced(rows: list[dict[str, Any]]) -> str:
    """The targets of ``rows``, grouped by the assumption their claim rests on."""
    by: dict[str, list[str]] = {}
    for r in rows:
        by.setdefault(r["claim"]["assumption"]["what"], []).append(r["target"])
    return "; ".join(f"{_names(ts)} ({what})" for what, ts in by.items()) or "none"


# -- one row ---------------------------------------------------------------------------------------
class Notes:
    """Numbered notes, one per distinct text, prefixed (P: claims, R: reasons, E: errors)."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.texts = prefix, {}

    def ref(self, text: str) -> str:
        if text not in self.texts:
            self.texts[text] = f"{self.prefix}{len(self.texts) + 1}"
        return self.texts[text]

    def lines(self) -> list[str]:
        return [f"- **{ref}** {text}" for text, ref in self.texts.items()]


def cells(
    r: dict[str, Any],
    claims: Notes,
    reasons: Notes,
    errors: Notes,
    setting: dict[str, Any] | None = None,
) -> list[str]:
    """One table row's cells (see :data:`COLUMNS`); ``setting``: the ledger's, against which
    a row's power is noted in its audit cell where it differs (:func:`power_notes`)."""
    run_eps = sig(r["epsilon"])
    if math.isinf(r["epsilon"]):
        run_eps += f" ({reasons.ref(r['reason'])})"
    first = [
        f"`{r['target']}`",
        f"{r['paper_short']} ({claims.ref(r['paper'])})",
        sig(r["epsilon_claimed"]),
    ]
    if r["error"] is not None:
        ref = errors.ref(r["error"])
        return [*first, "—", "—", run_eps, "—", f"no audit ({ref})", "—", "—", "—"]
    c, a = r["claim"], r["audit"]
    lo = sig(a["epsilon_lo"])
    notes = (["capped"] if a["capped"] else []) + power_notes(a, setting)
    if a.get("screening"):
        notes.append(f"rechecked at {a['confidence']:.4g}")
    if notes:
        lo += f" ({', '.join(notes)})"
    said = claim_text(c)
    if not r.get("paper_claims", True):
        said = f"no claim in the paper; our reading of its count: {said}"
    real = r.get("real")
    found = "—"
    if real is not None:
        found = sig(real["epsilon_lo"])
        if real["verdict"] == "violated":
            found += " (**violated**)"
        if real.get("screening"):
            found += f" (rechecked at {real['confidence']:.4g})"
    return [
        *first,
        sig(c["count"]["epsilon"]),
        sig(c["rule"]["epsilon"]),
        run_eps,
        sig(r["accounting"]["epsilon"]),
        lo,
        found,
        said,
        _verdict(r["accounting"]["verdict"], a["epsilon_lo"]),
    ]


def power_notes(a: dict[str, Any], setting: dict[str, Any] | None = None) -> list[str]:
    """A row's power where it is less than the ledger's (the setting line's): its trials
    where they are not --trials (a costly kind's share), and the canary candidates its audit
    searched where fewer than the most any row of the ledger searched ("no search": the
    first candidate alone)."""
    asked = a["trials_asked"] if setting is None else setting["audit"]["trials"]
    notes = [f"{a['trials']} trials"] if a["trials"] != asked else []
    if setting is not None and "searched" in a:
        most = max(p["canaries"] for p in setting["audit"]["plan"].values())
        if a["searched"] < most:
            notes.append("no search" if a["searched"] == 1 else f"{a['searched']} canaries")
    return notes


def final_cell(f: dict[str, Any] | None, errors: Notes) -> str:
    """A row's final-model cell: its defense's final-model audit ``f`` (None: not done yet,
    in a partial ledger) — the lower bound, the accounted upper bound it is held to and the
    verdict (:func:`_verdict`), or why it could not be made (an E-note)."""
    if f is None:
        return "—"
    if f["error"] is not None:
        note = f"final models of {f['defense']}: {f['error']}"
        return f"no audit ({errors.ref(note)})"
    lo = sig(f["epsilon_lo"]) + (" (capped)" if f["capped"] else "")
    return f"{lo} against {sig(f['upper'])}: {_verdict(f['verdict'], f['epsilon_lo'])}"


def claim_text(c: dict[str, Any]) -> str:
    """The claim column's verdict (see
    :func:`~privaudit.experiments.claims.claim_verdict`): a claim beaten only by canaries
    that break its unenforced assumption says so, with the strongest of them and the verdict
    of those that respect it; one refuted by both its count and its rule says so."""
    if c["verdict"] == "does not apply":
        m, bound = c["measured"], c["assumption"]["norm"]
        within = _verdict(c["under_assumption"], c["epsilon_lo"])
        return (
            "assumption not enforced in this run: the claim does not apply (measured: "
            f"ε ≥ {sig(m['epsilon_lo'])} with a canary of norm {sig(m['norm'])} > "
            f"G = {sig(bound)}; with norm ≤ G: {within})"
        )
    text = _verdict(c["verdict"], c["epsilon_lo"])
    if c["refuted_by"] and len([k for k in ("count", "rule") if c[k]["verdict"]]) > 1:
        text += f" ({' + '.join(c['refuted_by'])})"
    return text


def _verdict(v: str, lower: float) -> str:
    """A verdict as the ledger writes it: violated in bold, and a loose one whose lower
    bound is 0 as "no evidence" (:func:`~privaudit.experiments.audit.verdict` calls both
    loose, but a bound of 0 shows nothing, while a positive one well below the upper bound
    shows some leak, less than promised)."""
    if v == "violated":
        return "**violated**"
    return "no evidence" if v == "loose" and lower <= 0 else v
