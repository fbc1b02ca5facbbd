"""Claims a study takes from another study: one claim definition tested at two scales.

A CPU-scale study (config/studies/cpu/) runs a paper study's scenarios on data and a model a laptop
can train, and takes that study's claims as they are written, scenario by scenario:

    claims_from:
      - study: config/studies/factorized_fl_label.yaml   # from the repository root
        scenarios:                                        # theirs -> ours
          cifar10_standard_iid: standard_iid
          svhn_standard_iid: standard_iid                 # two of theirs may share one of ours
        methods: {factorized_fl_alpha: alpha_tau0.75}     # theirs -> ours, where the labels differ
        needs_paper_scale:                                # theirs, each with the reason
          scenarios: {shakespeare: "text: no embedded analogue"}
          methods: {lambda1: "VGG-16's 15 layers"}

Every scenario of the other study is mapped or has a reason, and every method one of its claims names
is ours (under its own label or through `methods`) or has a reason, so no claim is dropped without a
word. A claim keeps the comparisons whose scenarios are mapped (repeats removed); when some were not,
its `scale_note` says which need paper scale; when none is left, or it names a method that needs paper
scale, it is not tested here and its verdict is `needs paper scale`, with the reason. A borrowed claim
records the study it comes from (`origin`), which is where its paper-scale verdict lives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pydantic import TypeAdapter, ValidationError

from ..config import load_yaml
from ..errors import UsageError
from .spec import Claim, ClaimsFrom, _message, in_repository

_SIDES = ("a", "b", "method", "among")  # the claim keys that hold sides (a method, or a list of them)


def read_study_file(path: str | Path) -> dict[str, Any]:
    """A study YAML named by another study, from the working directory or the repository root."""
    try:
        doc = load_yaml(in_repository(path).read_text(encoding="utf-8"), str(path))
    except OSError as e:
        raise UsageError(f"cannot read study file {path} ({e.strerror or e})") from None
    if not isinstance(doc, dict) or "study" not in doc:
        raise UsageError(f"{path} is not a study file (it names no `study:`)")
    return doc


def _map_sides(claim: dict[str, Any], methods: Mapping[str, str]) -> list[str]:
    """Rename the methods of the claim's sides in place; return the labels they had."""
    named = []
    for key in _SIDES:
        value = claim.get(key)
        if value is None:
            continue
        for side in value if isinstance(value, list) else [value]:
            named.append(side["method"])
            side["method"] = methods.get(side["method"], side["method"])
    return named


def _reason(names: list[str], reasons: Mapping[str, str]) -> str:
    """`a, b: why; c: why not`: the names that share a reason together."""
    by_reason: dict[str, list[str]] = {}
    for n in dict.fromkeys(names):
        by_reason.setdefault(reasons[n], []).append(n)
    return "; ".join(f"{', '.join(ns)}: {why}" for why, ns in by_reason.items())


def _borrow_one(claim: Any, spec: ClaimsFrom, ours: Mapping[str, Any], origin: str, where: str
                ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the claim as this study tests it, None) or (None, the record of a claim that needs paper scale)."""
    doc = claim.model_dump(by_alias=True, exclude_none=True)
    deferred = {"origin": origin, "id": claim.id, "claim": claim.claim, "source": claim.source,
                "note": claim.note}
    named = _map_sides(doc, spec.methods)
    far = [m for m in named if m in spec.needs_paper_scale.methods]
    if far:
        return None, {**deferred, "reason": _reason(far, spec.needs_paper_scale.methods)}
    for label in (spec.methods.get(m, m) for m in named):
        if label not in ours["methods"]:
            raise UsageError(f"{where}: claim {claim.id!r} names method {label!r}, which this study does not list; "
                             "list it, map it (`methods`) or give the reason it needs paper scale "
                             "(`needs_paper_scale.methods`)")
    mapped, scenarios = spec.scenarios, claim.scenario_names()
    if "from" in doc:
        theirs = [(f, t) for f, t in zip(doc["from"], doc["to"]) if f in mapped and t in mapped]
        tested = {s for pair in theirs for s in pair}
        pairs = [(mapped[f], mapped[t]) for f, t in theirs]
        for f, t in pairs:
            if f == t:
                raise UsageError(f"{where}: claim {claim.id!r} compares two of its scenarios that this study maps "
                                 f"onto one ({f!r}); map them onto two")
        pairs = list(dict.fromkeys(pairs))
        doc["from"], doc["to"] = [f for f, _ in pairs], [t for _, t in pairs]
        kept = bool(pairs)
    else:
        tested = {s for s in doc["scenarios"] if s in mapped}
        doc["scenarios"] = list(dict.fromkeys(mapped[s] for s in doc["scenarios"] if s in mapped))
        kept = bool(doc["scenarios"])
    # a scenario mapped but paired only with one that is not is untested too; the reasons are the others'
    reasons = spec.needs_paper_scale.scenarios
    left_out = [s for s in scenarios if s not in mapped]
    if not kept:
        return None, {**deferred, "reason": _reason(left_out, reasons)}
    doc["origin"] = origin
    if len(tested) < len(scenarios):
        doc["scale_note"] = (f"tested on {len(tested)} of the paper study's {len(scenarios)} scenarios; "
                             f"paper scale only: {_reason(left_out, reasons)}")
    return doc, None


def borrowed_claims(config: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The claims `config`'s `claims_from` takes from other studies, as this study tests them, and
    those that need paper scale (one record each, with the reason). One UsageError line on a problem."""
    claims: list[dict[str, Any]] = []
    deferred: list[dict[str, Any]] = []
    for i, entry in enumerate(config.get("claims_from") or []):
        where = f"claims_from[{i}]"
        try:
            spec = ClaimsFrom.model_validate(entry)
        except ValidationError as err:
            raise UsageError(_message(err, f"{where}.")) from None
        source = read_study_file(spec.study)
        where = f"{where} ({spec.study})"
        theirs = list(source.get("scenarios") or {})
        named = [*spec.scenarios, *spec.needs_paper_scale.scenarios]
        for s in named:
            if s not in theirs:
                raise UsageError(f"{where}: no scenario {s!r} in that study ({', '.join(theirs)})")
        for s in theirs:
            if s not in named:
                raise UsageError(f"{where}: scenario {s!r} is neither mapped onto one of ours (`scenarios`) nor "
                                 "given a reason it needs paper scale (`needs_paper_scale.scenarios`)")
        their_methods = list(source.get("methods") or {})
        for m in [*spec.methods, *spec.needs_paper_scale.methods]:
            if m not in their_methods:
                raise UsageError(f"{where}: no method {m!r} in that study ({', '.join(their_methods)})")
        twice = set(spec.scenarios) & set(spec.needs_paper_scale.scenarios)
        if twice:
            raise UsageError(f"{where}: scenario {sorted(twice)[0]!r} is both mapped and left to paper scale")
        for s in spec.scenarios.values():
            if s not in (config.get("scenarios") or {}):
                raise UsageError(f"{where}: maps onto scenario {s!r}, which this study does not list")
        try:
            their_claims = TypeAdapter(list[Claim]).validate_python(source.get("claims") or [])
        except ValidationError as err:
            raise UsageError(f"{spec.study}: {_message(err, 'claims.')}") from None
        for claim in their_claims:
            doc, record = _borrow_one(claim, spec, config, source["study"], where)
            if doc is not None:
                claims.append(doc)
            else:
                assert record is not None  # _borrow_one returns exactly one of the two
                record["text"] = any(s.method in (source.get("text_variants") or {}) for s in claim.sides())
                deferred.append({k: v for k, v in record.items() if v is not None})
    return claims, deferred
