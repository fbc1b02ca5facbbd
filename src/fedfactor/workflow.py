"""Helpers the Snakefile imports: turning a study's nested overrides into CLI arguments."""

from __future__ import annotations

import json
import re
from typing import Any

from .config import load_config


def run_sets(overrides: dict[str, Any], **top: Any) -> list[str]:
    """Nested overrides -> `section.key=<json>` strings for `fedfactor train --set`.

    Only two levels are flattened: a value that is itself a mapping inside a section (for example
    partition.samples_per_client) is passed whole, as the config file would give it. JSON values
    parse back identically through the CLI's YAML reader, and keep strings such as "1" strings.
    """
    merged = dict(overrides)
    for section, value in top.items():
        # `top` holds study-wide defaults: a scenario's own value for the same key wins.
        if isinstance(value, dict) and isinstance(merged.get(section), dict):
            merged[section] = {**value, **merged[section]}
        else:
            merged.setdefault(section, value)
    out = []
    for section, value in merged.items():
        if isinstance(value, dict):
            out += [f"{section}.{key}={json.dumps(v)}" for key, v in value.items()]
        else:
            out.append(f"{section}={json.dumps(value)}")
    return out


def dataset_name(run_config: str, overrides: dict[str, Any]) -> str:
    """The dataset a scenario uses; loading the config here also validates it when the DAG is built."""
    return load_config(run_config, run_sets(overrides)).data.name


def slug(name: str) -> str:
    """A file-name-safe form of a dataset name such as npz:/path/to/file.npz."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
