"""Helpers the Snakefile imports: which scenarios and methods a study runs, with which overrides, and
the nested overrides turned into CLI arguments."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .config import load_config, read_mapping
from .data.datasets import SYNTHETIC_PREFIX
from .errors import UsageError


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


def method_sets(entry: dict[str, Any], label: str) -> list[str]:
    """A study's method entry as `--set`s: its keys are the run config's `method` section, except
    `run`, run-config overrides for this method's jobs alone (applied after the scenario's)."""
    entry = dict(entry)
    run = entry.pop("run", None) or {}
    return run_sets({**run, "method": entry, "label": label})


def partition_sets(run_config: str, overrides: dict[str, Any], data_root: str) -> list[str]:
    """A scenario's partition as `--set`s for `fedfactor partition`, without its run config: only
    what `build_partition` reads (the dataset and where it lies, its split, the number of clients, the
    partition's own fields; the seed comes from the job), resolved, so a change of rounds, model or
    method, in the study or in its run config, keeps the partitions."""
    cfg = load_config(run_config, run_sets(overrides, data={"root": data_root}))
    return run_sets({
        "data": {key: getattr(cfg.data, key) for key in ("name", "root", "split", "split_mode")},
        "fl": {"clients": cfg.fl.clients},
        "partition": cfg.partition.spec(),
    })


def dataset_name(run_config: str, overrides: dict[str, Any]) -> str:
    """The dataset a scenario uses; loading the config here also validates it when the DAG is built."""
    return load_config(run_config, run_sets(overrides)).data.name


def slug(name: str) -> str:
    """A file-name-safe form of a dataset name such as npz:/path/to/file.npz."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s values on top, mappings merged key by key at every depth."""
    out = dict(base)
    for key, value in over.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def selected(config: dict[str, Any], key: str) -> list[str]:
    """The study's scenarios or methods, narrowed to `select.<key>` when given (in the study's order)."""
    names = list(config[key])
    wanted = (config.get("select") or {}).get(key)
    if wanted is None:
        return names
    unknown = [n for n in wanted if n not in config[key]]
    if unknown:
        raise UsageError(f"select.{key} names {', '.join(map(repr, unknown))}, which the study does not list; "
                         f"it lists: {', '.join(names)}")
    return [n for n in names if n in wanted]


# Study keys that change what runs compute or which runs exist. A config file given after the study's
# own that sets one of them makes a variant of the study; `results`, `data_root`, `mlflow`,
# `threads_per_job`, `runs_per_job` and `gpus_per_job` only say where and how.
VARIANT_KEYS = ("run_config", "scenarios", "methods", "seeds", "overrides", "select", "smoke")


def study_folder(config: dict[str, Any], configfiles: list) -> str:
    """The study's folder under its results root: the study's name, plus `+<stem>` for every config
    file that makes a variant of it (sets a VARIANT_KEYS key, is not a study file itself, and names no
    `results:` root of its own), in the order given. So `--configfile study.yaml mine.yaml` writes to
    `<results>/<study>+mine` and never into the study's own runs; a scale file with its own `results:`
    (config/scale/*.yaml) keeps `<its results>/<study>`."""
    folder = config["study"]
    for path in configfiles:
        raw = read_mapping(path)
        if "study" not in raw and "results" not in raw and any(key in raw for key in VARIANT_KEYS):
            folder += "+" + slug(Path(path).stem)
    return folder


def scenario_overrides(config: dict[str, Any], scenario: str) -> dict[str, Any]:
    """A scenario's run-config overrides, the study-wide `overrides` on top, and in a smoke study
    the dataset swapped for its synthetic stand-in (same shape and classes)."""
    merged = deep_merge(config["scenarios"][scenario], config.get("overrides") or {})
    if config.get("smoke"):
        name = dataset_name(config["run_config"], merged)
        if not name.startswith(SYNTHETIC_PREFIX):
            merged = deep_merge(merged, {"data": {"name": SYNTHETIC_PREFIX + name}})
    return merged


def implemented(config: dict[str, Any], methods: list[str]) -> dict[str, bool]:
    """Method label -> whether its `name` is a registered method (a study may list a paper's
    baselines before they exist; they are skipped with a note, never silently)."""
    from .methods import METHODS

    return {m: config["methods"][m]["name"] in METHODS for m in methods}


def study_spec(config: dict[str, Any], scenarios: list[str], methods: dict[str, bool]) -> dict[str, Any]:
    """What the report steps need to know about the study, as results/<study>/study.json holds it."""
    return {
        "study": config["study"],
        "title": config.get("title") or config["study"],
        "smoke": bool(config.get("smoke")),
        "seeds": [int(s) for s in config["seeds"]],
        "scenarios": scenarios,
        "methods": {m: {"name": config["methods"][m]["name"], "implemented": ok} for m, ok in methods.items()},
        "paper": config.get("paper"),
        "claims": config.get("claims") or [],
        "text_variants": config.get("text_variants") or {},
    }
