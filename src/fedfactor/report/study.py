"""The DAG-time check of a study YAML's `paper` and `claims` sections (their schema: spec.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pydantic import TypeAdapter, ValidationError

from ..errors import UsageError
from .paper import resolve_tables
from .spec import Claim, PaperSpec, _message, reference_problem, variants_problem


def check_study_sections(config: Mapping[str, Any], numbers_dir: str | Path | None = None
                         ) -> tuple[PaperSpec | None, list[Any]]:
    """The `paper` and `claims` sections of a study YAML (or the merged Snakemake config), checked:
    their schema, that they name only the study's scenarios and method labels, and that every paper
    mapping finds exactly one value in its CSV. Returns them parsed; raises one UsageError line."""
    study = config.get("study", "?")
    try:
        paper = None if config.get("paper") is None else PaperSpec.model_validate(config["paper"])
    except ValidationError as err:
        raise UsageError(f"study {study}: {_message(err, 'paper.')}") from None
    try:
        claims = TypeAdapter(list[Claim]).validate_python(config.get("claims") or [])
    except ValidationError as err:
        raise UsageError(f"study {study}: {_message(err, 'claims.')}") from None
    methods = list(config.get("methods") or {})
    problem = (reference_problem(paper, claims, list(config.get("scenarios") or {}), methods)
               or variants_problem(config.get("text_variants") or {}, methods))
    if problem:
        raise UsageError(f"study {study}: {problem}")
    if paper is not None:
        resolve_tables(paper, numbers_dir)
    return paper, claims
