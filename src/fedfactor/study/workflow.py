"""Helpers the Snakefile imports: which scenarios and methods a study runs, with which overrides, the
nested overrides turned into CLI arguments, and the study's checks while the DAG is built."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, NoReturn, Sequence

from ..config import load_config, load_yaml, read_mapping
from ..data.datasets import SYNTHETIC_PREFIX
from ..errors import UsageError


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
    `run`, run-config overrides for this method's jobs alone (applied after the scenario's), and the
    study's `implemented` marker."""
    entry = dict(entry)
    run = entry.pop("run", None) or {}
    entry.pop("implemented", None)
    return run_sets({**run, "method": entry, "label": label})


def method_entry(config: dict[str, Any], scenario: str, label: str) -> dict[str, Any]:
    """A study's method entry as it runs in `scenario`: the scenario's own settings for that label
    (`scenarios.<scenario>.methods.<label>`) on top of the study's. A paper may set a method apart per
    dataset: FedFac splits FEMNIST's second conv but the last hidden layer of its other models."""
    own = (config["scenarios"][scenario].get("methods") or {}).get(label) or {}
    return deep_merge(config["methods"][label], own)


def scenario_sets(config: dict[str, Any], scenario: str) -> list[str]:
    """A scenario's `--set`s as every run of it gets them: its overrides, its name and the study's
    data root."""
    return run_sets(scenario_overrides(config, scenario), scenario=scenario, data={"root": config["data_root"]})


def final_entry(config: dict[str, Any], scenario: str, label: str,
                tuned: dict[str, dict[str, dict]] | None) -> dict[str, Any]:
    """A method's entry as the study's final runs take it: with the values chosen on validation
    (`tuned`, tuning.read_chosen's) where the study is tuned."""
    from . import tuning

    entry = method_entry(config, scenario, label)
    return tuning.with_values(entry, tuned[scenario][label]) if tuned else entry


def tuning_entries(config: dict[str, Any], scenario: str, label: str) -> list[dict[str, Any]]:
    """A method's entry at each point of the study's tuning grid (the study's own values underneath)."""
    from . import tuning

    return [tuning.with_values(method_entry(config, scenario, label), values)
            for values in tuning.points(config["tuning"], label)]


@dataclass(frozen=True)
class StudyRun:
    """Runs of a study that differ by their seed alone: one scenario and method, and one tuning point
    for a tuning run. A run's `--set`s are the scenario's, then what the workflow sets for each seed
    (seed, partition file, tracking), then the method's."""

    kind: str  # "final" or "tuning"
    scenario: str
    method: str
    point: int | None  # the tuning point's index; None for a final run
    scenario_sets: list[str]
    method_sets: list[str]
    seeds: list[int]

    @property
    def name(self) -> str:
        from .tuning import point_name

        own = f"{self.scenario}/{self.method}"
        return own if self.point is None else f"{own}@{point_name(self.point)}"

    @property
    def sets(self) -> list[str]:
        return [*self.scenario_sets, *self.method_sets]


def study_runs(config: dict[str, Any], tuned: dict[str, dict[str, dict]] | None = None) -> list[StudyRun]:
    """Every run a study trains, the one expansion the Snakefile, `fedfactor plan` and the tests use:
    its (selected) scenarios x implemented methods x seeds, the final runs at the values chosen on
    validation where `tuned` gives them, each followed, where the study is tuned, by its tuning runs:
    grid points x tuning seeds. A simulation study trains none."""
    if "simulation" in config:
        return []
    listed = implemented(config, selected(config, "methods"))
    methods = [m for m, ok in listed.items() if ok]
    tuning = config["tuning"] if tuning_file(config) else None
    runs = []
    for s in selected(config, "scenarios"):
        base = scenario_sets(config, s)
        for m in methods:
            runs.append(StudyRun("final", s, m, None, base, method_sets(final_entry(config, s, m, tuned), m),
                                 [int(seed) for seed in config["seeds"]]))
            if tuning:
                runs += [StudyRun("tuning", s, m, i, base, method_sets(entry, m), [int(x) for x in tuning["seeds"]])
                         for i, entry in enumerate(tuning_entries(config, s, m))]
    return runs



def seed_sets(scenario: str, of_scenario: list[str], seed: int, of_method: list[str], study_dir: str,
              mlflow_uri: str) -> list[str]:
    """A run's `--set`s in the order the train rule gives them to `fedfactor train-runs` (train.smk):
    the scenario's, then what the workflow sets for one seed (its partition file, the MLflow store; the
    experiment id, known once mlflow_init has run, a stand-in), then the method's."""
    partition = f"{study_dir}/partitions/{scenario}/seed{seed}.json"
    return [*of_scenario, f"seed={seed}", f"partition.file={partition}", f"tracking.uri={mlflow_uri}",
            "tracking.experiment_id=0", *of_method]


def checked_runs(config: dict[str, Any], tuned: dict[str, dict[str, dict]] | None, study_dir: str,
                 mlflow_uri: str) -> list[tuple[str, list[str]]]:
    """The runs `check_runs` loads, named: every run of the study's expansion once, at its first seed
    (a seed changes nothing else in a run config), and each further seed once: the final runs, the
    further seeds, then the tuning runs."""
    def sets(run: StudyRun, seed: int) -> list[str]:
        return seed_sets(run.scenario, run.scenario_sets, seed, run.method_sets, study_dir, mlflow_uri)

    runs = study_runs(config, tuned)
    final = [r for r in runs if r.kind == "final"]
    checked = [(f"scenario {r.scenario!r}, method {r.method!r}", sets(r, r.seeds[0])) for r in final]
    checked += [(f"seed {seed}", sets(final[0], seed)) for seed in final[0].seeds[1:]]
    return checked + [(f"tuning: scenario {r.scenario!r}, method {r.method!r}, point {r.point}", sets(r, r.seeds[0]))
                      for r in runs if r.kind == "tuning"]

# What `build_partition` reads of `data` (and fl.clients, and the partition section but its file).
PARTITION_DATA_KEYS = ("name", "root", "split", "split_mode", "seed")


def partition_sets(run_config: str, overrides: dict[str, Any], data_root: str) -> list[str]:
    """A scenario's partition as `--set`s for `fedfactor partition`, without its run config: only
    what `build_partition` reads (the dataset and where it lies, its split, the number of clients, the
    partition's own fields; the seed comes from the job), resolved, so a change of rounds, model or
    method, in the study or in its run config, keeps the partitions."""
    cfg = load_config(run_config, run_sets(overrides, data={"root": data_root}))
    return run_sets({
        "data": {key: getattr(cfg.data, key) for key in PARTITION_DATA_KEYS},
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
VARIANT_KEYS = ("run_config", "scenarios", "methods", "seeds", "overrides", "select", "smoke", "smoke_scale",
                "tuning")


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
    its run config's `smoke_scale` on top of those and the dataset swapped for its synthetic stand-in
    (same shape and classes)."""
    own = {key: value for key, value in config["scenarios"][scenario].items() if key != "methods"}
    merged = deep_merge(own, config.get("overrides") or {})
    if config.get("smoke"):
        merged = deep_merge(merged, (config.get("smoke_scale") or {}).get(Path(config["run_config"]).name, {}))
        try:
            name = dataset_name(config["run_config"], merged)
        except UsageError as e:
            raise UsageError(f"scenario {scenario!r}: {e}") from None
        if not name.startswith(SYNTHETIC_PREFIX):
            merged = deep_merge(merged, {"data": {"name": SYNTHETIC_PREFIX + name}})
    return merged


def implemented(config: dict[str, Any], methods: list[str]) -> dict[str, bool]:
    """Method label -> whether its `name` is a registered method (a study may list a paper's
    baselines before they exist, marked `implemented: false`; they are skipped with a note, never
    silently)."""
    from ..methods import METHODS

    return {m: config["methods"][m]["name"] in METHODS and config["methods"][m].get("implemented", True) is not False
            for m in methods}


def check_method_names(config: dict[str, Any]) -> None:
    """Every method the study lists is registered, or marked `implemented: false` (a paper's baseline
    not written yet): a typo (`fedavgg`) would otherwise be taken for such a baseline and get no jobs,
    without a word, and `snakemake -n` would pass."""
    import difflib

    from ..methods import METHODS

    for label, entry in config["methods"].items():
        name, marker = entry["name"], entry.get("implemented", True)
        if not isinstance(marker, bool):
            raise UsageError(f"methods.{label}.implemented: true or false (got {marker!r})")
        if marker and name not in METHODS:
            close = difflib.get_close_matches(name, METHODS.names(), n=3)
            hint = f"did you mean {' or '.join(close)}?" if close else f"registered: {', '.join(METHODS.names())}"
            raise UsageError(f"methods.{label}: no method is named {name!r}; {hint} (a paper's method not "
                             "implemented yet is listed with `implemented: false`)")


def study_spec(config: dict[str, Any], scenarios: list[str], methods: dict[str, bool]) -> dict[str, Any]:
    """What the report steps need to know about the study, as results/<study>/study.json holds it:
    its own claims and those it takes from other studies (report/borrow.py)."""
    from ..report.borrow import borrowed_claims

    borrowed, paper_scale_only = borrowed_claims(config)
    return {
        "study": config["study"],
        "title": config.get("title") or config["study"],
        "smoke": bool(config.get("smoke")),
        "seeds": [int(s) for s in config["seeds"]],
        "scenarios": scenarios,
        "methods": {m: {"name": config["methods"][m]["name"], "implemented": ok} for m, ok in methods.items()},
        "paper": config.get("paper"),
        "claims": [*(config.get("claims") or []), *borrowed],
        "text_variants": config.get("text_variants") or {},
        "paper_scale_only": paper_scale_only,
        # where the final runs' hyperparameters were chosen on validation data, if they were
        "tuned": tuning_file(config),
    }


def tuning_file(config: dict[str, Any]) -> str | None:
    """The file of chosen values the study's final runs read, or None for an untuned study."""
    tuning = config.get("tuning") or {}
    return tuning["file"] if tuning and tuning.get("use", True) else None


# ------------------------------------------------------------------------ checks at DAG build

def stop(problem: object) -> NoReturn:
    """A bad study ends the DAG build as one line on stderr and exit status 1, before any job runs:
    an exception raised in the Snakefile would come framed in Snakemake's file names and lines."""
    print(problem, file=sys.stderr, flush=True)
    sys.exit(1)


def check_config_files(paths: Sequence[str | Path]) -> None:
    """The config files of a DAG build (the command line's --configfile files, or without them the
    default study), each read as strictly as a run config (fedfactor.config.load_yaml) before the
    schema check: Snakemake's own reader keeps the last of two equal keys silently, and the schema's
    error message would print a YAML alias bomb whole, for ever. The first file must be a study
    (hold `study:`), the others only override it: a file without `study:` given alone would
    otherwise be merged into the default study (its scenarios beside the default's), and a second
    study into the first."""
    docs = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"{path}: cannot be read ({e})") from None
        docs.append((path, load_yaml(text, str(path))))
    if not docs:
        return
    for path, doc in docs:  # Snakemake refuses these itself, `plan` only here
        if not isinstance(doc, dict):
            what = "is empty" if doc is None else f"holds a {type(doc).__name__}, not a mapping of keys"
            raise UsageError(f"{path}: {what}; a study file maps keys such as study, run_config, seeds, scenarios "
                             "and methods to their values")
    first, doc = docs[0]
    if "study" not in doc:
        raise UsageError(f"{first}: holds no `study:`, so it is no study file. Give a study first and this file "
                         f"after it to override the study's keys, e.g. --configfile config/config.yaml {first}")
    for path, doc in docs[1:]:
        if "study" in doc:
            raise UsageError(f"{path}: a second study (study: {doc['study']!r}) after {first}; give one study file, "
                             "then files that override its keys")


def check_study(config: dict[str, Any]) -> None:
    """The one check of a study's own keys, after its files (check_config_files) and the schema:
    study.smk's DAG build and `fedfactor plan` call it, so both refuse a study with the same line. In
    order: the overrides, `select`, every method's name (and at least one implemented), the tuning
    section, the report's spec, the paper and claims sections. Nothing here loads a run config."""
    from . import tuning
    from ..report.spec import check_spec
    from ..report.study import check_study_sections

    # the schema takes 2.0 for an integer, which then ends the DAG build in a traceback (range(2.0))
    for key in ("threads_per_job", "runs_per_job", "gpus_per_job", "seeds"):
        value = config.get(key)
        values = value if isinstance(value, list) else [] if value is None else [value]
        if not all(type(v) is int for v in values):
            raise UsageError(f"{key} must be {'whole numbers' if key == 'seeds' else 'a whole number'} (got {value!r})")
    if "simulation" in config:
        return
    check_overrides(config)
    selected(config, "scenarios")
    check_method_names(config)
    runs = implemented(config, selected(config, "methods"))
    methods = [m for m, ok in runs.items() if ok]
    if not methods:
        listed = ", ".join(f"{m} ({config['methods'][m]['name']})" for m in runs)
        raise UsageError(f"none of the study's methods is implemented yet: {listed}")
    if tuning_file(config):
        tuning.check(config["tuning"], methods, config["methods"])
    check_spec(study_spec(config, list(config["scenarios"]), implemented(config, list(config["methods"]))))
    check_study_sections(config)


def check_results_folder(results: str) -> None:
    """The results root is a folder, or can be made one: a file there, or above it, would end the DAG
    build in a NotADirectoryError from inside Snakemake."""
    for folder in (Path(results), *Path(results).parents):
        if folder.exists():
            if not folder.is_dir():
                raise UsageError(f"results: {str(folder)!r} is a file, not a folder; give a folder for the results")
            return


def check_required_keys(config: dict[str, Any]) -> None:
    """What a study must name (the schema can say so only in one unreadable line)."""
    if "simulation" in config:
        return
    missing = [key for key in ("run_config", "seeds", "scenarios", "methods") if key not in config]
    if missing:
        raise UsageError(f"study {config.get('study')!r} lacks {', '.join(missing)}: a study names run_config, seeds, "
                         "scenarios and methods (or `simulation:`)")


def schema_problem(err: Exception) -> str:
    """Snakemake's schema error (jsonschema's error with the schema printed whole) as one line:
    where, and what is wrong."""
    import jsonschema

    cause = err.__context__
    if not isinstance(cause, jsonschema.ValidationError):
        return textwrap.shorten(str(err), 300)
    where = ".".join(map(str, cause.absolute_path))
    if cause.validator == "additionalProperties":
        known = list(cause.schema.get("properties", {}))
        unknown = [key for key in cause.instance if key not in known]
        what = f"unknown key {unknown[0]!r}; valid keys: {', '.join(known)}"
    else:
        what = textwrap.shorten(cause.message, 300)  # it repeats the value, which may be long
    return f"{where}: {what}" if where else what


# Keys the workflow sets for every run after the study's: given in a scenario, in `overrides` or in
# a method's `run`, they would be lost without a word (or, in `run`, point a run at another
# experiment's store or at a partition its scenario did not make).
SET_BY_WORKFLOW = {
    "seed": "the study's `seeds`",
    "scenario": "the scenario's name",
    "label": "the method's label under `methods`",
    "method": "the study's `methods`",
    "partition.file": "the scenario's partition job",
    "tracking.uri": "the study's `mlflow: {uri: ...}`",
    "tracking.experiment_id": "the study's `mlflow: {experiment: ...}`",
}


def check_overrides(config: dict[str, Any]) -> None:
    """No scenario, `overrides` or method `run` sets a key the workflow sets for each run, and no
    method's `run` changes what its scenario's partition is built from (the partition job, shared by
    the scenario's methods, would be used unchanged)."""
    places = [("overrides", config.get("overrides") or {})]
    places += [(f"scenarios.{name}", s) for name, s in config["scenarios"].items()]
    runs = [(f"methods.{name}.run", m.get("run") or {}) for name, m in config["methods"].items()]
    for where, overrides in places + runs:
        for dotted, owner in SET_BY_WORKFLOW.items():
            section, _, key = dotted.partition(".")
            value = overrides.get(section)
            if (isinstance(value, dict) and key in value) if key else section in overrides:
                raise UsageError(f"{where}.{dotted}: the workflow sets it for every run ({owner}); remove it")
    for name, scenario in config["scenarios"].items():
        for label, own in (scenario.get("methods") or {}).items():
            where = f"scenarios.{name}.methods.{label}"
            if label not in config["methods"]:
                raise UsageError(f"{where}: the study lists no method {label!r} ({', '.join(config['methods'])})")
            if not isinstance(own, dict) or "name" in own or "run" in own:
                raise UsageError(f"{where}: give a mapping of the method's hyperparameters (not its name or run)")
    for where, run in runs:
        changed = [f"{section}.{key}" for section, keys in (("data", PARTITION_DATA_KEYS), ("fl", ("clients",)))
                   if isinstance(run.get(section), dict) for key in run[section] if key in keys]
        if "partition" in run or changed:
            raise UsageError(f"{where}.{'partition' if 'partition' in run else changed[0]}: the scenario's partition "
                             "depends on it, and all methods of a scenario share one; make it a scenario of its own")


def check_runs(run_config: str, runs: Iterable[tuple[str, list[str]]]) -> None:
    """Every run's config loaded as its train job will load it (`load_config(run_config, sets)` with
    the `--set`s of its command, in their order: the method's hyperparameters typed and checked by
    the method), then what it names that the job would find wrong before training, without data:
    its dataset, its partition (kind, class groups) against the dataset's classes and its clients,
    its model's name. The first problem ends the check as a UsageError naming the run. Runs are
    (name, sets), e.g. ("scenario 'a', method 'fedavg'", [...]); each dataset and partition is
    checked once."""
    from ..data import dataset_info, task_label_maps
    from ..models import MODELS
    from ..run.setup import read_run

    datasets: dict[tuple[str, str], Any] = {}
    partitions: set[str] = set()
    for name, sets in runs:
        try:
            cfg = read_run(run_config, sets).cfg
            where = (cfg.data.name, cfg.data.root)
            if where not in datasets:
                datasets[where] = dataset_info(*where)
            info = datasets[where]
            partition = (cfg.partition.spec(), info.num_classes, cfg.fl.clients)
            if json.dumps(partition) not in partitions:
                task_label_maps(*partition)
                partitions.add(json.dumps(partition))
            MODELS.get(cfg.model.name)
        except UsageError as e:
            raise UsageError(f"{name}: {e}") from None

