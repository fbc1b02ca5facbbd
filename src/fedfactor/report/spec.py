"""What the workflow hands the report steps: a study, its paper's tables and the claims to check.

`results/<study>/study.json` is a `StudySpec`. The workflow writes it from the merged Snakemake config;
the `paper` and `claims` sections of a study YAML pass through unchanged. `check_study_sections` (study.py)
checks them (and every paper mapping against its CSV) in about a millisecond per study, so a typo can
fail while the DAG is built, before any training starts. The runs' values are in cells.py.

A study YAML's `paper` section (one entry per paper table; `fedfactor paper-tables` renders them):

    paper:
      name: Factorized-FL (000, NeurIPS 2022)
      tables:
        - csv: factorized_fl_table1_label.csv     # under config/paper_numbers/
          metric: [accuracy_pct, cost_gb]          # a section per metric
          scenarios:                               # our scenario -> the paper's column
            cifar10_standard_iid: {dataset: CIFAR-10, setting: Standard IID}
          methods:                                 # our method label -> the paper's row
            local: Stand-Alone
            factorized_fl_alpha: Factorized-FL alpha (Ours)

A setting is a list of parts separated by "; ". A scenario names the parts of its column and a method
may add parts of its own, for grids where the setting depends on the method (FedDecomp Table 2:
`rc20_rl20: {method: FedDecomp, setting: "R_l=20%; R_c=20%"}` next to the scenario's
"Dirichlet alpha=0.1"); the paper value is the one CSV row whose setting holds all those parts.
`cells:` maps single (scenario, method) pairs explicitly. `layout: {rows: R_l, columns: R_c}` lays a
grid out by two setting parts instead of methods x settings.

A study YAML's `claims` section (`fedfactor claims` gives each a verdict):

    claims:
      - id: beta_beats_baselines
        claim: Factorized-FL beta outperforms FedAvg and FedProx in every label scenario
        source: 000 section 5.2, Table 1 (top)
        kind: order            # order | ratio | drop | close | best
        a: factorized_fl_beta
        b: [fedavg, fedprox]
        scenarios: [cifar10_standard_iid, cifar10_permuted_iid]
        margin: 0              # accuracy in percentage points, bytes in GB

Claims compare means over seeds of `accuracy` (the reported accuracy, in %), `bytes` (bytes_total, in
GB) or `new_clients.<strategy>` (a strategy's accuracy on held-out clients, in %).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Sequence, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError,
                      field_validator, model_validator)

from ..config import EvalConfig
from ..errors import UsageError

SMOKE_TITLE = "SMOKE RUN on synthetic data — not results: "
SMOKE_COLUMN = "SMOKE RUN on synthetic data - not results"
SYNTHETIC_PREFIX = "synthetic:"
DEFAULT_NUMBERS = "config/paper_numbers"

Name = Annotated[str, Field(min_length=1)]
NonNegative = Annotated[float, Field(ge=0)]


class _Strict(BaseModel):
    # strict: a seed "1" or a margin "0.5" is a typo to report, not a value to coerce
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, populate_by_name=True)


def _parts(setting: str) -> list[str]:
    """A setting's parts: "Dirichlet alpha=0.1; R_l=20%" -> ["Dirichlet alpha=0.1", "R_l=20%"]."""
    return [p.strip() for p in setting.split(";") if p.strip()]


def _as_list(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


# ---------------------------------------------------------------------------------------- paper

PaperMetric = Literal["accuracy_pct", "accuracy_frac", "cost_gb"]
ACCURACY_METRICS = ("accuracy_pct", "accuracy_frac")


def _column_shorthand(value: Any) -> Any:
    # `scenario: "Standard IID"` is `scenario: [{setting: "Standard IID"}]`; one mapping is a list of one
    return [{"setting": v} if isinstance(v, str) else v for v in _as_list(value)]


def _row_shorthand(value: Any) -> Any:
    # `label: FedAvg` is `label: [{method: FedAvg}]`
    return [{"method": v} if isinstance(v, str) else v for v in _as_list(value)]


Clients = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
Strategy = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]


class Column(_Strict):
    """The paper column one of our scenarios fills."""

    dataset: Name | None = None  # the CSV's `dataset`; default: the table's `dataset`
    setting: Name  # parts ("; "-separated) the paper's setting must contain
    # Ours = the mean accuracy of these clients (0-based, summary.json per_client_accuracy, the last
    # round): a per-domain column. Default: the run's reported accuracy over all clients.
    clients: Clients | None = None

    @field_validator("clients")
    @classmethod
    def _unique(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError("lists a client twice")
        return v


class Row(_Strict):
    """The paper row (method) one of our method labels fills."""

    method: Name  # the CSV's `method`
    setting: Name | None = None  # more setting parts this method stands for (grids)
    # Ours = the accuracy of the held-out clients under this new-client strategy (summary.json
    # new_clients.strategies.<name>; weighted by test size when the protocol reports best_weighted)
    new_clients: Strategy | None = None


class Cell(_Strict):
    """One explicit (scenario, method) -> paper value mapping."""

    scenario: Name
    method: Name  # our method label
    dataset: Name | None = None
    setting: Name
    paper_method: Name
    clients: Clients | None = None
    new_clients: Strategy | None = None


class Layout(_Strict):
    """A grid laid out by two setting parts ("R_l=20%": key R_l) instead of methods x settings."""

    rows: Name
    columns: Name


class PaperTable(_Strict):
    csv: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+\.csv$")]  # a file in the numbers folder
    table: Name | None = None  # the CSV's `table` column, when one file holds several tables
    title: Name | None = None  # default: the CSV's paper and table
    metric: Annotated[list[PaperMetric], BeforeValidator(_as_list), Field(min_length=1)]
    dataset: Name | None = None  # default dataset of the scenario and cell mappings
    datasets: list[Name] | None = None  # the paper's datasets shown; default: those mapped
    scenarios: dict[Name, Annotated[list[Column], BeforeValidator(_column_shorthand), Field(min_length=1)]] = {}
    methods: dict[Name, Annotated[list[Row], BeforeValidator(_row_shorthand), Field(min_length=1)]] = {}
    cells: list[Cell] = []
    layout: Layout | None = None
    note: Name | None = None  # printed under the table's title

    @model_validator(mode="after")
    def _consistent(self) -> PaperTable:
        if not self.scenarios and not self.cells:
            raise ValueError("maps none of our scenarios; give `scenarios` or `cells`")
        if self.scenarios and not self.methods:
            raise ValueError("maps none of our methods; give `methods`")
        columns = [(f"scenario {s!r}", c) for s, cols in self.scenarios.items() for c in cols]
        rows = [(f"method {m!r}", r) for m, rs in self.methods.items() for r in rs]
        cells = [(f"cells[{i}]", c) for i, c in enumerate(self.cells)]
        for where, c in columns + cells:
            if c.dataset is None and self.dataset is None:
                raise ValueError(f"{where} names no dataset; give `dataset` there or for the whole table")
        picked = [(w, "clients") for w, c in columns + cells if c.clients is not None]
        picked += [(w, "new_clients") for w, r in rows + cells if r.new_clients is not None]
        if picked and not all(m in ACCURACY_METRICS for m in self.metric):
            raise ValueError(f"{picked[0][0]}: `{picked[0][1]}` picks accuracies; this table's metric is "
                             f"{', '.join(self.metric)}")
        kinds = {k for _, k in picked}
        if len(kinds) > 1 or any(c.clients is not None and c.new_clients is not None for _, c in cells):
            raise ValueError("a table takes per-client columns (`clients`) or new-client strategies "
                             "(`new_clients`), not both")
        return self

    def labels(self) -> list[str]:
        return list(dict.fromkeys([*self.methods, *(c.method for c in self.cells)]))

    def scenario_names(self) -> list[str]:
        return list(dict.fromkeys([*self.scenarios, *(c.scenario for c in self.cells)]))


class PaperSpec(_Strict):
    name: Name  # the paper, as tables name it: "Factorized-FL (000, NeurIPS 2022)"
    # the folder of the transcribed CSVs; relative paths are taken from the working directory (the
    # workflow runs in the repository root) or, failing that, the repository this package lives in
    numbers: Name = DEFAULT_NUMBERS
    tables: Annotated[list[PaperTable], Field(min_length=1)]


# --------------------------------------------------------------------------------------- claims

ClaimMetric = Annotated[str, Field(pattern=r"^(accuracy|bytes|new_clients\.[A-Za-z0-9_.-]+)$")]


def _side_shorthand(value: Any) -> Any:
    return {"method": value} if isinstance(value, str) else value


def _sides_shorthand(value: Any) -> Any:
    return [_side_shorthand(v) for v in _as_list(value)]


class Side(_Strict):
    """One method's number in a claim: its label and, if not the claim's, the metric."""

    method: Name
    metric: ClaimMetric | None = None


OneSide = Annotated[Side, BeforeValidator(_side_shorthand)]
Sides = Annotated[list[Side], BeforeValidator(_sides_shorthand), Field(min_length=1)]
Scenarios = Annotated[list[Name], BeforeValidator(_as_list), Field(min_length=1)]


def unit_of(metric: str) -> str:
    return "GB" if metric == "bytes" else "pp"


class _Claim(_Strict):
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]
    claim: Name  # the claim in words, as the paper makes it
    source: Name  # where: paper, section, table or figure
    note: Name | None = None  # why this reading, where the paper's own numbers disagree, ...
    metric: ClaimMetric = "accuracy"
    # set on a claim taken from another study (borrow.py): that study, and which of its scenarios
    # this scale cannot test
    origin: Name | None = None
    scale_note: Name | None = None

    def sides(self) -> list[Side]:
        raise NotImplementedError

    def scenario_names(self) -> list[str]:
        raise NotImplementedError

    def metric_of(self, side: Side) -> str:
        return side.metric or self.metric

    @model_validator(mode="after")
    def _one_unit(self):
        units = {unit_of(self.metric_of(s)) for s in self.sides()}
        if len(units) > 1:
            raise ValueError(f"claim {self.id!r} compares accuracies with bytes")
        return self


def _check_pairs(frm: list[str], to: list[str]) -> None:
    if len(frm) != len(to):
        raise ValueError(f"`from` and `to` pair scenarios one to one: {len(frm)} vs {len(to)} given")


class OrderClaim(_Claim):
    """Every a's metric above every b's in each scenario, by more than 0 and at least `margin`."""

    kind: Literal["order"]
    a: Sides
    b: Sides
    scenarios: Scenarios
    margin: NonNegative = 0.0

    def sides(self):
        return [*self.a, *self.b]

    def scenario_names(self):
        return list(self.scenarios)


class RatioClaim(_Claim):
    """a's metric over b's, in each scenario, within [min, max] (bytes unless `metric` says)."""

    kind: Literal["ratio"]
    metric: ClaimMetric = "bytes"
    a: OneSide
    b: OneSide
    scenarios: Scenarios
    min: Annotated[float, Field(ge=0)] | None = None
    max: Annotated[float, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _bounds(self):
        if self.min is None and self.max is None:
            raise ValueError(f"ratio claim {self.id!r} needs `min`, `max` or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"ratio claim {self.id!r}: min {self.min} is above max {self.max}")
        return self

    def sides(self):
        return [self.a, self.b]

    def scenario_names(self):
        return list(self.scenarios)


class DropClaim(_Claim):
    """A method's metric falls from each `from` scenario to its `to` scenario by at least `margin`."""

    kind: Literal["drop"]
    method: OneSide
    from_: Scenarios = Field(alias="from")
    to: Scenarios
    margin: NonNegative = 0.0

    @model_validator(mode="after")
    def _pairs(self):
        _check_pairs(self.from_, self.to)
        return self

    def sides(self):
        return [self.method]

    def scenario_names(self):
        return list(dict.fromkeys([*self.from_, *self.to]))


class CloseClaim(_Claim):
    """Two numbers within `tolerance`: a vs b in each scenario, or one method from -> to."""

    kind: Literal["close"]
    tolerance: NonNegative
    a: OneSide | None = None
    b: OneSide | None = None
    scenarios: Scenarios | None = None
    method: OneSide | None = None
    from_: Scenarios | None = Field(None, alias="from")
    to: Scenarios | None = None

    @model_validator(mode="after")
    def _one_form(self):
        across = (self.method, self.from_, self.to)
        within = (self.a, self.b, self.scenarios)
        if all(v is not None for v in within) and all(v is None for v in across):
            return self
        if all(v is not None for v in across) and all(v is None for v in within):
            assert self.from_ is not None and self.to is not None  # `across` is all set
            _check_pairs(self.from_, self.to)
            return self
        raise ValueError(f"close claim {self.id!r}: give either a, b and scenarios, or method, from and to")

    def sides(self):
        return [s for s in (self.a, self.b, self.method) if s is not None]

    def scenario_names(self):
        if self.scenarios is not None:
            return list(self.scenarios)
        assert self.from_ is not None and self.to is not None  # the other form, which _one_form checked
        return list(dict.fromkeys([*self.from_, *self.to]))


class BestClaim(_Claim):
    """`method` is the best of itself and `among` in each scenario, by at least `margin` (for bytes:
    the lowest)."""

    kind: Literal["best"]
    method: OneSide
    among: Sides
    scenarios: Scenarios
    margin: NonNegative = 0.0

    @model_validator(mode="after")
    def _not_itself(self):
        me = (self.method.method, self.metric_of(self.method))
        if any((s.method, self.metric_of(s)) == me for s in self.among):
            raise ValueError(f"best claim {self.id!r}: `among` lists the method itself")
        return self

    def sides(self):
        return [self.method, *self.among]

    def scenario_names(self):
        return list(self.scenarios)


CLAIM_KINDS = ("order", "ratio", "drop", "close", "best")


def _known_kind(value: Any) -> Any:
    # a clearer line than pydantic's "unable to extract tag using discriminator"
    if isinstance(value, dict) and value.get("kind") not in CLAIM_KINDS:
        raise ValueError(f"`kind` must be one of {', '.join(CLAIM_KINDS)} (got {value.get('kind')!r})")
    return value


Claim = Annotated[Union[OrderClaim, RatioClaim, DropClaim, CloseClaim, BestClaim],
                  Field(discriminator="kind"), BeforeValidator(_known_kind)]


# ---------------------------------------------------------------------------------------- study

class MethodEntry(_Strict):
    name: Name  # the registered method
    # False: listed in the study (a comparison method of the paper) but not implemented yet; it has
    # no runs, shows "not implemented yet" in tables and "not run" in claims
    implemented: bool


class PaperScaleOnly(_Strict):
    """The scenarios and methods of another study a scale cannot test, each with the reason."""

    scenarios: dict[Name, Name] = {}
    methods: dict[Name, Name] = {}


class ClaimsFrom(_Strict):
    """One entry of a study's `claims_from` (borrow.py): another study's claims, tested here."""

    study: Name  # that study's YAML file, from the repository root
    scenarios: dict[Name, Name] = {}  # its scenario -> ours
    methods: dict[Name, Name] = {}  # its method label -> ours, where they differ
    needs_paper_scale: PaperScaleOnly = PaperScaleOnly()


class DeferredClaim(_Strict):
    """A claim of another study that this study cannot test (borrow.py): its verdict here is
    `needs paper scale`, with the reason."""

    origin: Name
    id: Name
    claim: Name
    source: Name
    note: Name | None = None
    reason: Name
    text: bool = False  # it names an as-run method with a text variant: a row for each mode


class StudySpec(_Strict):
    study: Name
    title: Name
    smoke: bool  # the study's datasets were swapped for synthetic data
    seeds: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    scenarios: Annotated[list[Name], Field(min_length=1)]
    methods: Annotated[dict[Name, MethodEntry], Field(min_length=1)]
    paper: PaperSpec | None = None
    claims: list[Claim] = []
    # as-run label -> the label of its text-as-written variant: every claim naming an as-run label is
    # also checked with the text variants in its place, so the claims say which one reproduces
    text_variants: dict[Name, Name] = {}
    # the file of hyperparameters chosen on validation that the final runs use (None: untuned)
    tuned: Name | None = None
    # claims taken from other studies (claims_from, borrow.py) that this study cannot test
    paper_scale_only: list[DeferredClaim] = []

    @model_validator(mode="after")
    def _references(self) -> StudySpec:
        problem = (reference_problem(self.paper, self.claims, self.scenarios, list(self.methods))
                   or variants_problem(self.text_variants, list(self.methods)))
        if problem:
            raise ValueError(problem)
        return self


def variants_problem(text_variants: Mapping[str, str], methods: Sequence[str]) -> str | None:
    """The first label of a `text_variants` pair that the study does not list."""
    for label in (*text_variants, *text_variants.values()):
        if label not in methods:
            return f"text_variants names method {label!r}, which the study does not list ({', '.join(methods)})"
    return None


def with_text_variants(claim: Any, text_variants: Mapping[str, str]) -> Any | None:
    """The claim with each as-run label replaced by its text variant; None when it names none."""
    if not any(s.method in text_variants for s in claim.sides()):
        return None

    def swap(value: Any) -> Any:
        if isinstance(value, dict):
            # a side is {"method": label, ...}; a claim's own `method` may be such a side
            return {k: text_variants.get(v, v) if k == "method" and isinstance(v, str) else swap(v)
                    for k, v in value.items()}
        return [swap(v) for v in value] if isinstance(value, list) else value

    return TypeAdapter(Claim).validate_python(swap(claim.model_dump(by_alias=True, exclude_none=True)))


def reference_problem(paper: PaperSpec | None, claims: Sequence[Any], scenarios: Sequence[str],
                      methods: Sequence[str]) -> str | None:
    """The first scenario or method label that `paper` or `claims` name and the study does not list."""
    def unknown(names, known, kind, where):
        for n in names:
            if n not in known:
                return f"{where} names {kind} {n!r}, which the study does not list ({', '.join(known)})"
        return None

    checks = []
    for i, t in enumerate(paper.tables if paper else []):
        checks += [(t.scenario_names(), scenarios, "scenario", f"paper.tables[{i}]"),
                   (t.labels(), methods, "method", f"paper.tables[{i}]")]
    ids = [f"{c.origin}.{c.id}" if c.origin else c.id for c in claims]
    for c in claims:
        checks += [(c.scenario_names(), scenarios, "scenario", f"claim {c.id!r}"),
                   ([s.method for s in c.sides()], methods, "method", f"claim {c.id!r}")]
    for args in checks:
        if problem := unknown(*args):
            return problem
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    return f"claim ids repeat: {', '.join(repeated)}" if repeated else None


def load_study(path: str | Path) -> StudySpec:
    """results/<study>/study.json, checked; every problem is one UsageError line."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read study file {path} ({' '.join(str(e).split())})") from None
    try:
        return StudySpec.model_validate(doc)
    except ValidationError as err:
        raise UsageError(f"study file {path}: {_message(err)}") from None


def check_spec(doc: Mapping[str, Any]) -> StudySpec:
    """What the workflow hands the report steps (fedfactor.study.workflow.study_spec), checked; one
    UsageError line on any problem."""
    try:
        return StudySpec.model_validate(doc)
    except ValidationError as err:
        raise UsageError(_message(err)) from None


def _message(err: ValidationError, prefix: str = "") -> str:
    """The first error as one line: `where: what is wrong (got value)`."""
    e = err.errors()[0]
    loc = [str(p) for p in e["loc"]]
    # drop the claim kind pydantic puts into the location of a tagged union member
    loc = [p for i, p in enumerate(loc) if not (p in CLAIM_KINDS and i and loc[i - 1].isdigit())]
    where = prefix + ".".join(loc) if loc else prefix.rstrip(".") or "study"
    if e["type"] == "missing":
        return f"{where}: missing"
    if e["type"] == "extra_forbidden":
        return f"{where}: unknown key"
    msg = e["msg"].removeprefix("Value error, ")
    got = e.get("input")
    shown = "" if isinstance(got, (dict, list)) else f" (got {got!r})"
    return f"{where}: {msg[0].lower()}{msg[1:]}{shown}".replace("\n", " ")


def in_repository(path: str | Path) -> Path:
    """`path` as given where it exists (from the working directory), else the same relative path in the
    repository this package lives in where it exists there: the workflow runs in the repository root,
    a user's command may not."""
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        repo = Path(__file__).resolve().parents[3]  # src/fedfactor/report/spec.py -> repository
        if (repo / p).exists():
            return repo / p
    return p


def numbers_folder(paper: PaperSpec, override: str | Path | None = None) -> Path:
    """The folder of the paper's CSVs (see PaperSpec.numbers)."""
    folder = in_repository(override if override is not None else paper.numbers)
    if not folder.is_dir():
        raise UsageError(f"paper numbers folder {folder} does not exist; run from the repository root or set "
                         "paper.numbers")
    return folder


PROTOCOL_WORDS = {
    "client": "on its own test split", "shared": "on the pooled test split through its own label map",
    "received": "model as received from the server", "trained": "model after its local training",
    "last": "last round", "best": "best round of the mean", "best_weighted": "best round of the test-size-weighted mean",
    "best_val": "round best on validation",
}


def protocol_words(protocol: EvalConfig | None) -> str:
    """How our clients were scored, in words (docs/protocols.md)."""
    if protocol is None:
        return "no runs yet"
    return (f"each client's {PROTOCOL_WORDS[protocol.model]} scored {PROTOCOL_WORDS[protocol.test_pool]}, "
            f"{PROTOCOL_WORDS[protocol.report]} (eval: test_pool {protocol.test_pool}, model {protocol.model}, "
            f"report {protocol.report})")
