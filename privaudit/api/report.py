"""``privaudit report``: what a run or a study showed, as one page.

A *source* is a folder one of the commands wrote — ``attack``, ``audit`` or ``mia``'s
``--out`` (a run's result), ``compare`` or ``claims``'s ``--out`` (a study) — or a run
folder (``train --out``). :func:`locate` says which from the folder's marker and files;
:func:`build` reads the JSON and CSV files the command wrote (never a pickle, never the
cache's tensors: reading a study changes nothing in it) and the figures it drew, and makes
one :class:`~privaudit.eval.page.Page`: the grids, a ROC with the region the DP guarantee
allows (redrawn from ``scores.csv``), the audit verdicts with their evidence, the ledger's
rows, the configuration and the versions of the code. :func:`write` writes it as
``report.html`` (self-contained) and, asked, ``report.md`` and ``report.tex``.
"""

from __future__ import annotations

import csv
import json
import math
import platform
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privaudit.api.cache import code_identity
from privaudit.core.errors import PrivauditError
from privaudit.core.files import atomic_write, dumps_strict
from privaudit.core.text import sig
from privaudit.eval import membership_scoring
from privaudit.eval.page import Code, Figure, Page, Section, Table, to_html, to_latex, to_markdown
from privaudit.eval.style import threat_text, title

__all__ = ["FILES", "KINDS", "Source", "build", "locate", "outputs", "write"]

KINDS = ("attack", "audit", "mia", "compare", "claims", "run")
FILES = {"html": "report.html", "markdown": "report.md", "latex": "report.tex"}
MARKER = ".privaudit-out"  # the marker a command leaves in its --out (privaudit.cli.options)
# the file that tells each kind apart where a folder has no marker
SIGNS = (
    ("claims", "ledger.json"),
    ("compare", "summary.csv"),
    ("audit", "audit.json"),
    ("run", "manifest.json"),
)
WHAT = (
    "give the --out folder of privaudit attack, audit, mia, compare or claims, or a run "
    "folder (train --out)"
)
PNG = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Source:
    """A folder to report on: where it is, which command wrote it, and whether it carries
    privaudit's output marker (then the report may be written into it)."""

    folder: Path
    kind: str
    marked: bool


# --------------------------------------------------------------------------- reading


def read_json(path: Path) -> Any:
    """``path`` parsed as JSON (``Infinity`` and ``"inf"`` alike are read later as ∞), or
    one line naming the file and the fix."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PrivauditError(
            f"{path} is missing; rerun the command that wrote {path.parent}"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise PrivauditError(
            f"cannot read {path}: {' '.join(str(e).split())}; rerun the command that wrote "
            f"{path.parent}"
        ) from None


def _optional(path: Path) -> dict[str, Any]:
    """A JSON object the report can do without (a marker, a cache entry): {} when it is
    absent, unreadable or not an object."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file the commands wrote ([] when it is absent)."""
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def number(v: Any) -> float | None:
    """A value of a result as a float: None for none or empty, ∞ for ``inf``/``Infinity``."""
    if v is None or v == "":
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def as_text(v: Any) -> str:
    """A value of a configuration as written: a string as it is, anything else as strict
    one-line JSON (:func:`privaudit.core.files.dumps_strict`)."""
    return v if isinstance(v, str) else dumps_strict(v, indent=None, sort_keys=False)


def fmt(v: Any, digits: int = 3) -> str:
    """A number for a table: 3 significant digits, ∞, or — for none."""
    x = number(v)
    return "—" if x is None or math.isnan(x) else sig(x, digits)


def eps(v: Any) -> str:
    """ε for a table: None (no formal guarantee) is ∞."""
    x = number(v)
    return "∞" if x is None else sig(x)


def png(path: Path) -> bytes | None:
    """The bytes of a PNG file, or None when it is absent or not a PNG."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return data if data.startswith(PNG) else None


def locate(path: str | Path) -> Source:
    """The folder ``path`` names (a result file names its folder) and which command wrote
    it, or one line saying what to give instead."""
    p = Path(path).expanduser()
    if p.is_file() and p.name in ("result.json", "audit.json", "ledger.json", "summary.csv"):
        p = p.parent
    if not p.exists():
        raise PrivauditError(f"{path} does not exist; {WHAT}")
    if not p.is_dir():
        raise PrivauditError(f"{path} is a file, not a folder; {WHAT}")
    marked = (p / MARKER).is_file()
    kind = _optional(p / MARKER).get("command")
    if kind not in KINDS or kind == "run":
        kind = next((k for k, name in SIGNS if (p / name).is_file()), None)
    if kind is None and (p / "result.json").is_file():
        kind = "mia" if "auc" in read_json(p / "result.json") else "attack"
    if kind is None:
        raise PrivauditError(
            f"{path} holds no privaudit result (result.json, audit.json, ledger.json, "
            f"summary.csv or a run's manifest.json); {WHAT}"
        )
    if kind == "run" and not (p / "config.json").is_file():
        raise PrivauditError(f"{path} has a manifest.json but no config.json; {WHAT}")
    return Source(p, kind, marked and kind != "run")


def outputs(dest: Path, markdown: bool, latex: bool) -> list[Path]:
    """The files :func:`write` writes into ``dest``: report.html, and .md / .tex asked."""
    names = [FILES["html"]] + [FILES["markdown"]] * markdown + [FILES["latex"]] * latex
    return [dest / n for n in names]


def write(page: Page, dest: Path, markdown: bool = False, latex: bool = False) -> list[Path]:
    """``page`` into ``dest`` as report.html (and report.md, report.tex), each atomically."""
    dest.mkdir(parents=True, exist_ok=True)
    paths = outputs(dest, markdown, latex)
    render = {".html": to_html, ".md": to_markdown, ".tex": to_latex}
    for p in paths:
        text = render[p.suffix](page)
        atomic_write(p, lambda tmp, text=text: Path(tmp).write_text(text, encoding="utf-8"))
    return paths


def build(source: Source) -> Page:
    """The page of ``source``: its kind's sections, then the configuration and versions."""
    builders: dict[str, Callable[[Path], Page]] = {
        "attack": attack_page,
        "audit": audit_page,
        "mia": mia_page,
        "compare": compare_page,
        "claims": claims_page,
        "run": run_page,
    }
    page = builders[source.kind](source.folder)
    page.sections.append(versions(source))
    return page


# --------------------------------------------------------------------------- shared parts


def pairs(caption: str, rows: list[tuple[str, Any]], note: str = "") -> Table:
    """A two-column table of (what, value), values formatted, rows without a value left
    out."""
    shown = [[k, v if isinstance(v, str) else fmt(v)] for k, v in rows if v not in (None, "")]
    return Table(caption, ["what", "value"], shown, note)


def run_config(run: Path) -> list[Section]:
    """The run's configuration and privacy accounting (its config.json), where it is."""
    path = run / "config.json"
    if not path.is_file():
        return []
    cfg = read_json(path)
    resolved = cfg.pop("resolved", {}) or {}
    scalar = [(k, as_text(v)) for k, v in sorted(cfg.items())]
    items: list[Any] = [pairs(f"Configuration of the run ({path})", scalar)]
    agents = resolved.get("agents") or []
    if agents:
        rows = [
            [str(a.get("agent")), eps(a.get("epsilon")), fmt(a.get("sample_rate"))] for a in agents
        ]
        note = resolved.get("epsilon_reason") or ""
        items.append(
            Table(
                "Privacy accounting: each agent over the run",
                ["agent", "ε", "sample rate q"],
                rows,
                note,
            )
        )
    setting = [(k, v) for k, v in resolved.items() if isinstance(v, str | int | float)]
    if setting:
        items.append(pairs("Accounting setting", setting))
    return [Section("Configuration", items)]


def versions(source: Source) -> Section:
    """The code that wrote the results (where the command recorded it) and the code that
    wrote this report."""
    producers = sorted(
        {
            str(doc.get("code"))
            for p in source.folder.glob("*/*/*/entry.json")
            if isinstance(doc := _optional(p).get("producer"), dict)
        }
    )
    lines = [f"report written by: {code_identity()}"]
    lines += [f"python {platform.python_version()}, numpy {np.__version__}"]
    if producers:
        lines += [f"results written by: {p}" for p in producers]
    else:
        lines += [f"results written by: not recorded by privaudit {source.kind}"]
    return Section(
        "Versions", [Code("The code behind these results and this page", "\n".join(lines))]
    )


def roc_figure(
    member: np.ndarray, scores: dict[str, np.ndarray], bound: tuple[float, float] | None, name: str
) -> Figure | None:
    """A ROC of each score (members against the rest), with the DP region of ``bound``,
    drawn in the figure style and read back as PNG bytes; None without both classes."""
    if member.all() or not member.any():
        return None
    curves = {
        f"{k} (AUC {sig(membership_scoring.auc(s[member], s[~member]))})": membership_scoring.roc(
            s[member], s[~member]
        )
        for k, s in scores.items()
    }
    if bound is not None and not math.isfinite(bound[0]):
        bound = None
    with tempfile.TemporaryDirectory() as tmp:
        path = membership_scoring.plot_roc(curves, Path(tmp) / "roc.png", bound, name)
        data = path.read_bytes()
    dp = (
        ""
        if bound is None
        else f"; shaded: beyond what (ε = {sig(bound[0])}, δ = {sig(bound[1], 2)})-DP allows"
    )
    return Figure(f"ROC (log–log) of {name}{dp}", data, "scores.csv")


def columns(rows: list[dict[str, str]]) -> dict[str, np.ndarray]:
    """A CSV's numeric columns as arrays."""
    if not rows:
        return {}
    out = {}
    for k in rows[0]:
        try:
            out[k] = np.array([float(r[k]) for r in rows])
        except (TypeError, ValueError):
            continue
    return out


# --------------------------------------------------------------------------- a run's result


def attack_page(folder: Path) -> Page:
    """``attack``'s result.json and grid.png: what was reconstructed, per victim."""
    r = read_json(folder / "result.json")
    threat = threat_text(r.get("adversaries") or [r.get("threat", "")])
    head = title(threat, r.get("target"), r.get("round"), number(r.get("epsilon")))
    page = Page(f"privaudit attack · {head}", f"what privaudit attack wrote in {folder}")
    m = r.get("metrics") or {}
    obs = r.get("per_observation") or []
    scored = sum(o.get("psnr") is not None for o in obs)
    text = (
        f"{r.get('attack')} reconstructs the batches behind {r.get('target')}'s messages of "
        f"round {r.get('round')}, observed by {threat}: PSNR {fmt(m.get('psnr'))} dB, SSIM "
        f"{fmt(m.get('ssim'))}, label accuracy {fmt(m.get('label_acc'))} (mean over the "
        f"{scored} of {len(obs)} victims whose batch held an image)."
    )
    items: list[Any] = [text]
    if r.get("epsilon") is None and r.get("epsilon_reason"):
        items.append(f"ε of the attacked messages over the run: ∞ — {r['epsilon_reason']}")
    grid = png(folder / "grid.png")
    if grid is not None:
        items.append(
            Figure(
                "Each victim's images (top) and their reconstructions under them, "
                "PSNR/SSIM under each",
                grid,
                "grid.png",
            )
        )
    else:
        where = r.get("rounds_with_a_batch") or []
        items.append(
            "No grid: every victim's batch was empty, nothing to reconstruct"
            + (f" (rounds with a batch: {', '.join(map(str, where))})." if where else ".")
        )
    items.append(_victims(r))
    items.append(
        pairs(
            "Setting",
            [
                ("target", r.get("target")),
                ("round", str(r.get("round"))),
                ("attack", r.get("attack")),
                ("attack options", as_text(r.get("attack_options") or {})),
                ("threat", threat),
                ("ε of the attacked kind over the run", eps(r.get("epsilon"))),
                ("ε the paper's count gives", r.get("epsilon_claimed")),
                ("ε of the run (everything on the wire)", eps(r.get("run_epsilon"))),
                ("δ", r.get("delta")),
                ("σ (noise multiplier)", r.get("sigma")),
                ("expected batch size B", r.get("batch_size")),
                ("wall time (s)", r.get("wall_s")),
            ],
        )
    )
    page.sections.append(Section("Reconstruction", items))
    page.sections += run_config(_run_folder(folder, r))
    return page


def _victims(r: dict[str, Any]) -> Table:
    """attack's scores per observation: who, which link, how many images, how well."""
    obs = r.get("per_observation") or []
    n = len(obs)
    links = r.get("links") or [[None, None]] * n
    sizes = r.get("batch_sizes") or [None] * n
    used = r.get("attack_used") or [None] * n
    adversaries = r.get("adversaries") or [""] * n
    hows = [_how(m) for m in r.get("attack_meta") or [{}] * n]
    rows = []
    for o, (src, dst), b, a, adv, how in zip(
        obs, links, sizes, used, adversaries, hows, strict=False
    ):
        rows.append(
            [
                str(src),
                f"{src} → {dst}",
                adv,
                "—" if b is None else str(b),
                a or "— (empty batch)",
                fmt(o.get("psnr")),
                fmt(o.get("ssim")),
                fmt(o.get("mse")),
                fmt(o.get("lpips")),
                fmt(o.get("label_acc")),
                how,
            ]
        )
    head = ["victim", "link", "observer", "batch", "attack", "PSNR dB", "SSIM", "MSE", "LPIPS"]
    return Table("Per victim", [*head, "label acc", "how"], rows)


def _how(meta: dict[str, Any]) -> str:
    """How the attack says it solved one observation (``attack_meta``: its own ``how``, or
    why a completion was skipped), "" where it says neither."""
    own = meta.get(meta.get("attack")) if isinstance(meta.get("attack"), str) else None
    own = own if isinstance(own, dict) else meta
    complete = own.get("complete")
    skipped = complete.get("skipped") if isinstance(complete, dict) else None
    parts = [own.get("how"), f"completion skipped: {skipped}" if skipped else None]
    return "; ".join(p for p in parts if isinstance(p, str))


def _run_folder(folder: Path, r: dict[str, Any]) -> Path:
    """The run a result came from: its recorded path where it still exists, else ``run``
    beside the result (a run trained into the command's --out)."""
    recorded = Path(str(r.get("run") or ""))
    return recorded if r.get("run") and (recorded / "config.json").is_file() else folder / "run"


def audit_page(folder: Path) -> Page:
    """``audit``'s audit.json and scores.csv: the verdicts, their evidence, the ROC."""
    a = read_json(folder / "audit.json")
    upper = a.get("upper") or {}
    eps_up = number(upper.get("accountant"))
    head = title(a.get("threat"), a.get("target"), a.get("round"), eps_up)
    page = Page(f"privaudit audit · {head}", f"what privaudit audit wrote in {folder}")
    verdicts = a.get("verdicts") or {}
    items: list[Any] = [
        f"Verdict: {a.get('verdict')}. The {a.get('mode')} canary audit shows ε ≥ "
        f"{fmt(a.get('epsilon_lo'))} for one release of {a.get('target')} at confidence "
        f"{fmt(a.get('confidence'))}, over {a.get('trials')} trials."
    ]
    items.append(
        Table(
            "Verdicts: the audited lower bound against each upper bound of one release",
            ["upper bound", "ε upper, one release", "audited ε ≥", "verdict"],
            [
                [k, eps(v), fmt(a.get("epsilon_lo")), str(verdicts.get(k, "—"))]
                for k, v in upper.items()
            ],
        )
    )
    items.append(_audit_evidence(a))
    items += [f"Caveat: {c}" for c in (a.get("accounting") or {}).get("caveats") or []]
    fig = _audit_roc(folder, a, eps_up, head)
    items.append(fig if fig is not None else "No ROC: scores.csv is absent or has one class.")
    page.sections.append(Section("Audit", items))
    page.sections += run_config(folder / "run")
    return page


def _audit_evidence(a: dict[str, Any]) -> Table:
    """What the audit's bound rests on: trials, the canary, the tests' bounds."""
    canary = a.get("canary") or {}
    gdp = a.get("gdp") or {}
    cp = a.get("clopper_pearson") or {}
    one = a.get("one_run") or {}
    return pairs(
        "Evidence",
        [
            ("mode", a.get("mode")),
            ("trials", str(a.get("trials"))),
            ("confidence", a.get("confidence")),
            ("threat", a.get("threat")),
            ("victim → receiver", f"{a.get('victim')} → {a.get('receiver', '—')}"),
            (
                "canary",
                ", ".join(f"{k} {v if isinstance(v, str) else fmt(v)}" for k, v in canary.items()),
            ),
            ("statistic", a.get("statistic")),
            ("Clopper–Pearson ε ≥", cp.get("epsilon_lo")),
            (
                "Gaussian DP μ (interval)",
                _interval(gdp.get("mu"), gdp.get("mu_lo"), gdp.get("mu_hi")),
            ),
            ("Gaussian DP ε ≥", gdp.get("epsilon_lo")),
            ("one-run, f-DP: ε ≥", (a.get("one_run_fdp") or {}).get("epsilon_lo")),
            ("one-run, f-DP: μ ≥", (a.get("mu") or {}).get("lower") if one else None),
            ("one-run, Steinke et al.: ε ≥", one.get("epsilon")),
            ("trade-off curve: μ ≥", (a.get("tradeoff") or {}).get("mu_lo")),
            ("δ", a.get("delta")),
            ("interrupted", "yes" if a.get("interrupted") else None),
            ("seconds", a.get("seconds")),
        ],
    )


def _interval(v: Any, lo: Any, hi: Any) -> str | None:
    return None if v is None else f"{fmt(v)} [{fmt(lo)}, {fmt(hi)}]"


def _audit_roc(folder: Path, a: dict[str, Any], eps_up: float | None, head: str) -> Figure | None:
    """The audit's trials as a ROC (canary in against out), white-box: the chosen canary's."""
    cols = columns(read_csv(folder / "scores.csv"))
    coin = cols.get("coin", cols.get("included"))
    if coin is None or "score" not in cols:
        return None
    keep = np.ones(len(coin), bool)
    chosen = (a.get("search") or {}).get("chosen")
    if "candidate" in cols and chosen is not None:
        keep = cols["candidate"] == chosen
    bound = None if eps_up is None else (eps_up, float(a.get("delta") or 0.0))
    scores = {"canary score": cols["score"][keep]}
    return roc_figure(coin[keep] > 0.5, scores, bound, f"{head} · canary audit")


def mia_page(folder: Path) -> Page:
    """``mia``'s result.json and scores.csv: the scores' power, the ROC, the ε bound."""
    m = read_json(folder / "result.json")
    model = "scores" in m and isinstance(m.get("scores"), dict)
    bound = number(m.get("epsilon") if model else m.get("epsilon_release"))
    where = f"round {m.get('round')}" if model else f"rounds {_span(m.get('rounds'))}"
    head = title(
        m.get("threat"),
        m.get("target"),
        where.removeprefix("round ") if model else None,
        bound,
        [] if model else [where],
    )
    page = Page(f"privaudit mia · {head}", f"what privaudit mia wrote in {folder}")
    table = m["scores"] if model else {m.get("scorer", "score"): m}
    rows = []
    fprs = sorted({f for s in table.values() for f in (s.get("tpr_at_fpr") or {})}, key=float)
    for name, s in table.items():
        tprs = [_tpr((s.get("tpr_at_fpr") or {}).get(f)) for f in fprs]
        rows.append([name, fmt(s.get("auc")), *tprs])
    items: list[Any] = [
        f"Membership inference ({m.get('attack')}) on {m.get('target')}, {where}: "
        f"{m.get('members', '—')} members against {m.get('nonmembers', '—')} non-members. "
        f"ε lower bound from these examples: {fmt(m.get('epsilon_lo'))}."
    ]
    items.append(
        Table(
            "Power of each score: AUC and TPR at low FPR [confidence interval]",
            ["score", "AUC", *[f"TPR @ {float(f):.3g} FPR" for f in fprs]],
            rows,
            "Not measurable: the non-members cannot resolve that FPR (1/n is larger); no TPR is "
            "printed below it.",
        )
    )
    cols = columns(read_csv(folder / "scores.csv"))
    if "member" in cols:
        name = {"score": str(m.get("scorer", "score"))}  # a message-level mia's one score
        scores = {name.get(k, k): v for k, v in cols.items() if k != "member"}
        delta = float(m.get("delta") or 0.0)
        fig = roc_figure(
            cols["member"] > 0.5, scores, None if bound is None else (bound, delta), head
        )
        items.append(fig if fig is not None else "No ROC: the scores hold one class only.")
    elif png(folder / "roc.png") is not None:
        items.append(Figure("ROC as mia drew it", png(folder / "roc.png") or b"", "roc.png"))
    per = m.get("per_message") or []
    if per:
        items.append(
            Table(
                "Per observed message",
                ["round", "victim → receiver", "threat", "AUC", "label counts exact"],
                [
                    [
                        str(p.get("round")),
                        f"{p.get('victim')} → {p.get('receiver')}",
                        str(p.get("threat")),
                        fmt(p.get("auc")),
                        fmt(p.get("label_counts_exact")),
                    ]
                    for p in per
                ],
            )
        )
    page.sections.append(Section("Membership inference", items))
    page.sections += run_config(_run_folder(folder, m))
    return page


def _span(rounds: Any) -> str:
    return f"{rounds[0]}–{rounds[-1]}" if isinstance(rounds, list) and rounds else str(rounds)


def _tpr(p: dict[str, Any] | None) -> str:
    """A TPR with its interval, or why it is not measured."""
    if not p:
        return "—"
    if not p.get("resolved"):
        return f"not measurable (resolves {fmt(p.get('resolution'))})"
    return f"{fmt(p.get('tpr'))} [{fmt(p.get('tpr_lo'))}, {fmt(p.get('tpr_hi'))}]"


# --------------------------------------------------------------------------- a study


def _pm(row: dict[str, str], key: str) -> str:
    """Mean ± spread from a summary row; — where nothing was scored."""
    v, s = number(row.get(key)), number(row.get(f"{key}_spread"))
    if v is None:
        return "—"
    return fmt(v) + ("" if s is None else f" ± {fmt(s, 2)}")


SUMMARY = (
    ("target", lambda r: r["target"]),
    ("round", lambda r: r["round"]),
    ("ε asked", lambda r: fmt(r.get("epsilon_requested"))),
    ("ε message", lambda r: fmt(r.get("epsilon"))),
    ("ε run", lambda r: fmt(r.get("run_epsilon"))),
    ("σ", lambda r: fmt(r.get("sigma"))),
    ("threat", lambda r: r.get("threat", "")),
    ("seeds", lambda r: r.get("seeds", "")),
    ("scored / victims", lambda r: f"{r.get('scored', '—')} / {r.get('victims', '—')}"),
    ("PSNR dB", lambda r: _pm(r, "psnr")),
    ("SSIM", lambda r: _pm(r, "ssim")),
    ("label acc", lambda r: fmt(r.get("label_acc"))),
    ("test acc", lambda r: _pm(r, "test_acc")),
    ("audit ε ≥", lambda r: fmt(r.get("audit_epsilon_lo"))),
    ("MIA AUC", lambda r: fmt(r.get("mia_auc"))),
)
FIGURES = (
    ("grid-", "Reconstructions under their originals, one block per target, aligned per victim"),
    ("sweep-", "PSNR and SSIM (mean ± spread) across the sweep"),
    ("privacy-utility-", "Privacy against utility: reconstruction PSNR against test accuracy"),
    ("frontier", "The privacy–utility frontier"),
)


def compare_page(folder: Path) -> Page:
    """``compare``'s summary.csv, cells.csv and figures: the study's table and plots."""
    summary = read_csv(folder / "summary.csv")
    if not summary:
        raise PrivauditError(
            f"{folder / 'summary.csv'} holds no row: the comparison did not finish; rerun "
            "privaudit compare with the same --out (it resumes)"
        )
    targets = list(dict.fromkeys(r["target"] for r in summary))
    threat = "/".join(dict.fromkeys(r.get("threat", "") for r in summary))
    page = Page(
        f"privaudit compare · {threat} threat · {', '.join(targets)}",
        f"what privaudit compare wrote in {folder}",
    )
    spread = summary[0].get("spread_over", "seeds")
    table = Table(
        "Summary: one row per (target, round, ε asked)",
        [h for h, _ in SUMMARY],
        [[str(get(r)) for _, get in SUMMARY] for r in summary],
        f"Mean ± s.d. over {spread}; scored: the victims whose batch held an image; ∞: no "
        "formal guarantee.",
    )
    items: list[Any] = [table]
    for prefix, caption in FIGURES:
        for p in sorted(folder.glob(f"{prefix}*.png")):
            data = png(p)
            if data is not None:
                items.append(Figure(f"{caption} ({p.stem})", data, p.name))
    cells = read_csv(folder / "cells.csv")
    if cells:
        items.append(
            Table(
                "Every attacked cell",
                [
                    "target",
                    "round",
                    "ε asked",
                    "seed",
                    "scored / victims",
                    "PSNR dB",
                    "SSIM",
                    "attack",
                ],
                [
                    [
                        c["target"],
                        c["round"],
                        fmt(c.get("epsilon_requested")),
                        c.get("seed", ""),
                        f"{c.get('scored', '—')} / {c.get('victims', '—')}",
                        fmt(c.get("psnr")),
                        fmt(c.get("ssim")),
                        f"{c.get('attack', '')}, {c.get('iterations', '')} it.",
                    ]
                    for c in cells
                ],
            )
        )
    page.sections.append(Section("Comparison", items))
    if (folder / "frontier.md").is_file():
        page.sections.append(
            Section("Frontier", [Code("frontier.md", (folder / "frontier.md").read_text())])
        )
    runs = sorted(p for p in (folder / "runs").glob("*") if (p / "config.json").is_file())
    if runs:
        page.sections += run_config(runs[0])
        page.sections[-1].items.insert(
            0, f"The first of {len(runs)} runs (the others differ in defense, ε or seed)."
        )
    return page


def claims_page(folder: Path) -> Page:
    """``claims``' ledger.json: each claim beside the correct ε and the audit's evidence."""
    doc = read_json(folder / "ledger.json")
    rows = doc.get("rows") or []
    setting = doc.get("setting") or {}
    page = Page(
        f"privaudit claims · ledger of {len(rows)} message kinds",
        f"what privaudit claims wrote in {folder}",
    )
    items: list[Any] = []
    if not doc.get("complete", True):
        items.append(
            "Incomplete: the ledger was interrupted; rerun claims with the same --out to finish it."
        )
    ledger = [
        [
            str(r.get("target")),
            str(r.get("paper_short") or r.get("paper") or "—"),
            fmt(r.get("epsilon_claimed")),
            fmt((r.get("claim") or {}).get("count", {}).get("epsilon")),
            fmt(r.get("epsilon")),
            fmt((r.get("accounting") or {}).get("epsilon")),
            _audited(r.get("audit")),
            fmt((r.get("real") or {}).get("epsilon_lo")),
            str((r.get("claim") or {}).get("verdict") or "—"),
            str((r.get("accounting") or {}).get("verdict") or "—"),
        ]
        for r in rows
    ]
    head = ["target", "paper's claim", "claimed ε, run", "claimed ε, release", "accounted ε, run"]
    head += [
        "accounted ε, release",
        "audit ε ≥, release",
        "real example ε ≥",
        "claim",
        "accounting",
    ]
    items.append(
        Table(
            "The ledger: promise, truth and evidence per message kind",
            head,
            ledger,
            "claim / accounting: the audit's lower bound against that ε for one release.",
        )
    )
    items.append(_ledger_evidence(rows))
    why = [[str(r.get("target")), str(r.get("reason"))] for r in rows if r.get("reason")]
    if why:
        items.append(Table("Why ∞: kinds without a formal guarantee", ["target", "reason"], why))
    flat = [(k, v) for k, v in _flat(setting)]
    items.append(pairs("Setting of the ledger", flat))
    page.sections.append(Section("Claims ledger", items))
    return page


def _audited(audit: dict[str, Any] | None) -> str:
    if not audit:
        return "—"
    return fmt(audit.get("epsilon_lo")) + (" (capped)" if audit.get("capped") else "")


def _ledger_evidence(rows: list[dict[str, Any]]) -> Table:
    """What each row's audit rests on: the canary, trials, confidence, who observed."""
    out = []
    for r in rows:
        a = r.get("audit") or {}
        c = a.get("canary") or {}
        out.append(
            [
                str(r.get("target")),
                f"{c.get('kind', '—')}, norm {fmt(c.get('norm'))}",
                f"{a.get('trials', '—')} of {a.get('trials_asked', '—')}",
                fmt(a.get("confidence")),
                str(a.get("threat", "—")),
                f"{a.get('victim', '—')} → {a.get('receiver', '—')}",
                str(len(a.get("candidates") or [])),
                str(r.get("error") or ""),
            ]
        )
    head = ["target", "canary", "trials", "confidence", "threat", "victim → receiver"]
    return Table("Evidence behind each audit", [*head, "canaries searched", "error"], out)


def _flat(d: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += _flat(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", as_text(v)))
    return out


def run_page(folder: Path) -> Page:
    """A run folder: its configuration, accounting and the rounds it recorded."""
    manifest = read_json(folder / "manifest.json")
    files = manifest.get("files") or {}
    cfg = read_json(folder / "config.json")
    what = f"{cfg.get('defense')} · {cfg.get('agents')} agents · {cfg.get('rounds')} rounds"
    page = Page(f"privaudit run · {what}", f"the run in {folder}")
    kinds = {"checkpoints": 0, "messages": 0, "secrets": 0}
    for name in files:
        head = name.split("/")[0]
        if head in kinds:
            kinds[head] += 1
    page.sections.append(
        Section(
            "Recorded",
            [
                pairs(
                    "What the run recorded (its manifest)", [(k, str(v)) for k, v in kinds.items()]
                )
            ],
        )
    )
    page.sections += run_config(folder)
    return page
