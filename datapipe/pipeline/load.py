"""Pipeline files: YAML loaded safely into typed models, with errors that name the key.

Every problem is found before any work starts and reported as
``stages[2].dedup.threshold: 1.5 is out of range: Input should be less than or equal to 1``,
all problems at once, so a user fixes the file in one go.
"""

from __future__ import annotations

import glob
import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import Field

from datapipe.config.input_names import input_name
from datapipe.config.limits import ReadLimits
from datapipe.config.mixture import MixtureEntry, MixtureValue, mixture_weights, repeat_problems
from datapipe.config.sections import (  # the sections lower layers take (why apart: config/sections.py)
    NAME_PATTERN,
    SOURCE_KINDS,
    SourceConfig,
    SplitConfig,
    Strict,
    TokenizeConfig,
    WorkersConfig,
    read_yaml,
    yaml_error_text,
)
from datapipe.errors import EXIT_USAGE, DatapipeError
from datapipe.pipeline.problems import did_you_mean, show, validate_all
from datapipe.plugins import PluginError
from datapipe.storage.uri import StorageError, glob_files, is_input_file, is_uri, mirror_of

if TYPE_CHECKING:  # the stage registry is imported late (validation only); its option type is named here
    from datapipe.stages.base import StageOptions

__all__ = [
    "ConfigError",
    "Pipeline",
    "PipelineConfig",
    "SourceConfig",
    "SplitConfig",
    "TokenizeConfig",
    "build_pipeline",
    "load_pipeline",
    "read_yaml",
    "yaml_error_text",
]


class ConfigError(DatapipeError, ValueError):
    """A pipeline file that cannot run; ``problems`` are 'key.path: message' lines."""

    exit_code = EXIT_USAGE

    def __init__(self, problems: list[str], file: str | None = None) -> None:
        self.problems = problems
        self.file = file
        head = f"invalid pipeline file {file}" if file else "invalid pipeline"
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in problems))


class PipelineConfig(Strict):
    name: str = Field(pattern=NAME_PATTERN, description="Pipeline name; the default run folder is out/<name>.")
    output: str | None = Field(None, description="Run folder, relative to the pipeline file; default out/<name>.")
    sources: list[SourceConfig] = Field(
        min_length=1, description="Input sources, in run order (the order that picks earliest copies and lays out shards)."
    )
    stages: list[dict[str, Any]] = Field(
        default_factory=list, description="Stages in the order they run, each a mapping {stage type: options}."
    )
    tokenize: TokenizeConfig | None = Field(
        None, description="Tokenize kept documents into packed token shards; omitted: no shards."
    )
    mixture: dict[str, MixtureValue] | None = Field(
        None,
        description="Per source name: its target weight (for stats, the loader, the report and Megatron export), or "
        "{weight, bucket, repeat, rehydrate} to also repeat its documents by classify bucket; keeps and drops nothing.",
    )
    batch_size: int = Field(1000, ge=1, le=1_000_000, description="Documents per batch inside a task.")
    limits: ReadLimits = Field(default_factory=ReadLimits, description="Per-record caps on hostile input.")
    split: SplitConfig = Field(default_factory=SplitConfig, description="How inputs become map tasks.")
    workers: WorkersConfig = Field(
        default_factory=WorkersConfig,
        description="When a Ray worker process is replaced by a fresh one (bounds the memory a reused worker carries).",
    )


class Pipeline:
    """A validated pipeline: the typed config plus everything resolved against the file system."""

    def __init__(
        self,
        config: PipelineConfig,
        base_dir: Path,
        stage_options: list[tuple[str, StageOptions]],
        inputs: dict[str, list[tuple[Path, str]]],
        file: Path | None,
    ) -> None:
        self.config = config
        self.base_dir = base_dir
        self.stage_options = stage_options  # [(stage type, validated options)], in order
        self.inputs = inputs  # source name -> [(file, format)], sorted: the shard order
        self.input_names: dict[str, dict[Path, str]] = {}  # source -> file -> its name in ids (input_names.py)
        self.file = file
        # 'key.path: message' lines for settings that run but likely not as meant (Stage.warnings):
        # printed by `datapipe validate` and at the start of a run.
        self.warnings: list[str] = []

    @property
    def name(self) -> str:
        return self.config.name

    def resolve(self, p: str) -> Path:
        path = Path(p).expanduser()
        return path if path.is_absolute() else (self.base_dir / path)

    def default_output(self) -> Path | str:
        """The run folder: a path (relative to the pipeline file), or a URI such as s3://bucket/run."""
        if self.config.output and is_uri(self.config.output):
            return self.config.output
        return self.resolve(self.config.output or f"out/{self.config.name}")

    def normalized(self) -> dict[str, Any]:
        """The config with defaults filled in: what a run folder records and compares."""
        # workers: how tasks are run, not what they output (a run resumes under other settings)
        data = self.config.model_dump(mode="json", exclude={"output", "workers"})
        for src in data["sources"]:  # unset, they leave the config (and so the run's identity) as it was before them
            for key in ("license", "license_field"):
                if src.get(key) is None:
                    src.pop(key, None)
        data["stages"] = [{kind: opts.model_dump(mode="json")} for kind, opts in self.stage_options]
        if self.config.tokenize:
            data["tokenize"]["tokenizer_sha256"] = _sha256(self.resolve(self.config.tokenize.tokenizer))
        return data

    def resources(self) -> list[dict[str, Any]]:
        """Every file besides this one that the run's decisions depend on, as run.json records them.

        Each stage names its own (``Stage.resource_files``): rule sets, word and domain lists, the
        license class table, models. See ``datapipe.pipeline.identity``.
        """
        from datapipe.pipeline.identity import record_resources
        from datapipe.stages import STAGES  # late import: only validation needs the stage registry

        files = [(kind, f) for kind, opts in self.stage_options for f in STAGES[kind].resource_files(opts, self.base_dir)]
        return record_resources(files, self.base_dir)

    def fingerprint(self) -> str:
        """The run's identity: the normalized config (tokenizer hash included, stages' run settings left
        out) and every resource file's hash.

        A pipeline whose stages read no files keeps the fingerprint it had before resources counted.
        """
        from datapipe.pipeline.identity import identity, identity_config

        data = identity_config(self.normalized())
        resources = identity(self.resources())
        if resources:
            data = {**data, "resources": resources}  # not a config key: PipelineConfig forbids unknown keys
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def load_pipeline(path: str | Path) -> Pipeline:
    file = Path(path)
    if not file.is_file():
        raise ConfigError([f"pipeline file not found: {file}"])
    try:
        raw = read_yaml(file)
    except yaml.YAMLError as exc:
        raise ConfigError([yaml_error_text(exc)], str(file)) from None
    except UnicodeDecodeError:
        raise ConfigError(["not a UTF-8 text file"], str(file)) from None
    return build_pipeline(raw, file.resolve().parent, file)


def build_pipeline(raw: Any, base_dir: Path, file: Path | None = None) -> Pipeline:
    problems: list[str] = []
    try:
        return _build(raw, base_dir, file, problems)
    except PluginError as exc:  # an installed plugin that cannot be used (datapipe/plugins): checking stops there
        raise ConfigError([*problems, *exc.problems], str(file) if file else None) from None


def _build(raw: Any, base_dir: Path, file: Path | None, problems: list[str]) -> Pipeline:
    where = str(file) if file else None
    if not isinstance(raw, dict):
        raise ConfigError([f"the top level must be a mapping of keys (name, sources, stages, ...), got {show(raw)}"], where)
    # Every section is checked even when another has errors, so the file is fixed in one go: a
    # config with errors is repaired (problems.py) only to run the checks that need the objects.
    # A wrong name only names the default output folder: a stand-in lets the rest be checked.
    top = validate_all(PipelineConfig, raw, item_lists=("sources",), stand_ins={"name": "pipeline"})
    problems.extend(top.problems)
    config = top.value
    items = raw.get("stages")
    checked = _validate_stages(items, problems) if isinstance(items, list) else []
    if config is None:
        _check_stage_resources(base_dir, _raw_kinds(raw), checked, problems)
        raise ConfigError(_in_file_order(problems, raw), where)
    pipeline = Pipeline(config, base_dir, [(kind, opts) for _, kind, opts in checked], {}, file)
    dropped = set(top.dropped.get("sources", []))
    at = [i for i in range(len(raw.get("sources") or [])) if i not in dropped]  # config.sources[n] is sources[at[n]]
    pipeline.inputs = _resolve_inputs(pipeline, problems, at)
    _check_semantics(pipeline, problems, _raw_names(raw))
    _check_stage_resources(base_dir, frozenset(s.kind for s in config.sources), checked, problems)
    if problems:
        raise ConfigError(_in_file_order(problems, raw), where)
    pipeline.warnings = _stage_warnings(base_dir, frozenset(s.kind for s in config.sources), checked)
    return pipeline


def _raw_sources(raw: dict[str, Any]) -> list[dict[str, Any]]:
    sources = raw.get("sources")
    return [s for s in sources if isinstance(s, dict)] if isinstance(sources, list) else []


def _raw_names(raw: dict[str, Any]) -> list[str]:
    """The source names as written (a source left out of the checked config still names itself)."""
    return [s["name"] for s in _raw_sources(raw) if isinstance(s.get("name"), str)]


def _raw_kinds(raw: dict[str, Any]) -> frozenset[str]:
    return frozenset(k for k in (s.get("kind", "text") for s in _raw_sources(raw)) if k in SOURCE_KINDS)


def _in_file_order(problems: list[str], raw: dict[str, Any]) -> list[str]:
    """Problems in the order of the keys they name in the file (a stage's problems together)."""

    def position(problem: str) -> tuple[int, ...]:
        path = re.match(r"[^\s:]+(?=:)", problem)
        node: Any = raw
        out = []
        for part in re.findall(r"\[\d+\]|[^.\[\]]+", path.group(0) if path else ""):
            if part.startswith("["):
                out.append(int(part[1:-1]))
                node = node[out[-1]] if isinstance(node, list) and out[-1] < len(node) else None
            elif isinstance(node, dict):
                keys = list(node)
                out.append(keys.index(part) if part in keys else len(keys))
                node = node.get(part)
            else:
                break
        return tuple(out)

    return sorted(dict.fromkeys(problems), key=position)


def _validate_stages(items: list[Any], problems: list[str]) -> list[tuple[int, str, StageOptions]]:
    """(index in the file, stage type, options) of every stage whose options are valid.

    A stage with a wrong key is still checked: its options with that key left out (problems.py).
    """
    from datapipe.stages import STAGES  # late import: only validation needs the stage registry

    out: list[tuple[int, str, StageOptions]] = []
    allowed = ", ".join(sorted(STAGES))
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            continue  # the top-level validation already reported it
        if len(item) != 1:
            problems.append(
                f"stages[{i}]: each stage is a mapping with exactly one key (the stage type), "
                f"got keys {sorted(item)}; stage types: {allowed}"
            )
            continue
        ((kind, options),) = item.items()
        if kind not in STAGES:
            problems.append(f"stages[{i}]: unknown stage type {kind!r}{did_you_mean(kind, STAGES)}; allowed: {allowed}")
            continue
        if options is None:
            options = {}
        if not isinstance(options, dict):
            problems.append(f"stages[{i}].{kind}: options must be a mapping (use {{}} for defaults), got {show(options)}")
            continue
        try:
            model = STAGES[kind].Options
        except PluginError as exc:  # a plugin's stage whose module cannot be imported
            problems.append(f"stages[{i}].{kind}: {exc}")
            continue
        result = validate_all(model, options, prefix=f"stages[{i}].{kind}")
        problems.extend(result.problems)
        if result.value is not None:
            out.append((i, kind, result.value))
    counts: dict[str, int] = {}
    for _, kind, _ in out:
        counts[kind] = counts.get(kind, 0) + 1
    for kind, n in counts.items():
        if n > 1 and not STAGES[kind].repeatable:
            problems.append(f"stages: stage type {kind!r} appears {n} times; it may appear once")
    return out


def _check_stage_resources(
    base_dir: Path, kinds: frozenset[str], checked: list[tuple[int, str, StageOptions]], problems: list[str]
) -> None:
    """Each stage's own check: files, model labels, names; what `run` would otherwise find out mid-way."""
    from datapipe.stages import STAGES
    from datapipe.stages.base import CheckContext

    for n, (i, kind, opts) in enumerate(checked):
        before = tuple((k, o) for _, k, o in checked[:n])
        context = CheckContext(base_dir, kinds, before)
        for key, message in STAGES[kind].check(opts, context):
            problems.append(f"stages[{i}].{kind}{'.' + key if key else ''}: {message}")


def _stage_warnings(base_dir: Path, kinds: frozenset[str], checked: list[tuple[int, str, StageOptions]]) -> list[str]:
    """Each stage's warnings (``Stage.warnings``), as 'stages[i].kind.key: message' lines."""
    from datapipe.stages import STAGES
    from datapipe.stages.base import CheckContext

    out = []
    for n, (i, kind, opts) in enumerate(checked):
        context = CheckContext(base_dir, kinds, tuple((k, o) for _, k, o in checked[:n]))
        for key, message in STAGES[kind].warnings(opts, context):
            out.append(f"stages[{i}].{kind}{'.' + key if key else ''}: {message}")
    return out


def _resolve_inputs(pipeline: Pipeline, problems: list[str], at: list[int] | None = None) -> dict[str, list[tuple[Path, str]]]:
    """Each source's input files and formats; ``at``: each source's index in the file (some may be left out)."""
    from datapipe.readers import READER_SPECS, infer_format

    inputs: dict[str, list[tuple[Path, str]]] = {}
    for n, src in enumerate(pipeline.config.sources):
        i = at[n] if at is not None else n
        files: list[Path] = []
        pattern_of: dict[Path, str] = {}  # the first pattern that matched each file names it in ids
        for j, pattern in enumerate(src.paths):
            if is_uri(pattern):  # object storage: listed there, named by mirror paths, never downloaded here
                try:
                    resolved = str(mirror_of(pattern))
                    matched = [mirror_of(f.uri) for f in glob_files(pattern)]
                except StorageError as exc:
                    problems.append(f"sources[{i}].paths[{j}]: {exc}")
                    continue
            else:
                resolved = str(pipeline.resolve(pattern))
                matched = sorted(Path(m) for m in glob.glob(resolved, recursive=True))
                matched = [
                    m for m in matched if m.is_file() or m.is_dir() and _reads_folders(src.format or infer_format(m, src.kind))
                ]
            if not matched:
                problems.append(
                    f"sources[{i}].paths[{j}]: {pattern!r} matches no file "
                    + ("in object storage" if is_uri(pattern) else f"(resolved against {pipeline.base_dir})")
                )
            files.extend(matched)
            for m in matched:
                pattern_of.setdefault(m, resolved)
        entries: list[tuple[Path, str]] = []
        for f in dict.fromkeys(files):  # a file matched by two globs is one shard
            fmt = src.format or infer_format(f, src.kind)
            if fmt is None:
                problems.append(
                    f"sources[{i}].format: cannot infer the format of {f.name}; "
                    f"set format to one of: {', '.join(sorted(READER_SPECS))}"
                )
                break
            if fmt not in READER_SPECS:
                problems.append(
                    f"sources[{i}].format: {fmt!r} is not supported{did_you_mean(fmt, READER_SPECS)}; "
                    f"allowed: {', '.join(sorted(READER_SPECS))}"
                )
                break
            entries.append((f, fmt))
        inputs[src.name] = entries
        names = {f: input_name(f, pattern_of[f], pipeline.base_dir) for f, _ in entries}
        first: dict[str, Path] = {}
        for f, name in names.items():
            if name in first:
                problems.append(
                    f"sources[{i}].paths: {first[name]} and {f} would both be named {name!r} in "
                    f"document ids (inputs outside the pipeline folder are named relative to "
                    f"their pattern's fixed folder); match both with one pattern over a common "
                    f"folder, or split them into two sources"
                )
            first.setdefault(name, f)
        pipeline.input_names[src.name] = names
        for fmt in sorted({f for _, f in entries}):
            _validate_reader_options(i, src, fmt, pipeline.base_dir, problems)
        _check_text_field(i, src, entries, problems, pipeline.config.limits.max_record_bytes)
    return inputs


def _reads_folders(fmt: str | None) -> bool:
    from datapipe.readers import READER_SPECS

    return fmt is not None and fmt in READER_SPECS and READER_SPECS[fmt].folders


def _check_text_field(
    i: int, src: SourceConfig, entries: list[tuple[Path, str]], problems: list[str], max_record_bytes: int
) -> None:
    """A text field no record has rejects every document as missing_text_field: look at the first file.

    Only the first file whose format can be probed is read (its spec's ``probe_fields``: a Parquet
    footer, the first 20 records of a JSONL, where the field counts as present when any has it), so
    validation stays fast; it holds no more of a record than the reader would (``limits.max_record_bytes``).
    """
    from datapipe.readers import reader_spec

    field = src.options.get("content_field") or src.text_field
    key = f"sources[{i}].options.content_field" if src.options.get("content_field") else f"sources[{i}].text_field"
    first = next(
        ((f, reader_spec(fmt)) for f, fmt in entries if reader_spec(fmt).probe_fields is not None and is_input_file(f)), None
    )
    if first is None or not isinstance(field, str):
        return
    path, spec = first
    try:
        names = spec.probe_fields(path, max_record_bytes)  # type: ignore[misc]
    except Exception:  # an unreadable file is the reader's business: it becomes an unreadable_input reject
        return
    if names is not None and field not in names:
        shown = ", ".join(sorted(names)[:20]) or "none"
        problems.append(
            f"{key}: {field!r} is not a {spec.probed_as} {path} (fields: {shown}); every document "
            f"would be rejected as missing_text_field"
        )


def _validate_reader_options(i: int, src: SourceConfig, fmt: str, base_dir: Path, problems: list[str]) -> None:
    from datapipe.readers import reader_spec

    model = reader_spec(fmt).options
    if model is None:
        if src.options:
            problems.append(f"sources[{i}].options: the {fmt} reader takes no options, got {sorted(src.options)}")
        return
    result = validate_all(model, src.options, prefix=f"sources[{i}].options")
    problems.extend(result.problems)
    options = result.value
    # The arXiv metadata join opens its file per input; a missing one would fail every input of the source.
    metadata = getattr(options, "metadata", None)
    if metadata:
        path = Path(metadata).expanduser()
        path = path if path.is_absolute() else base_dir / path
        if not path.is_file():
            problems.append(f"sources[{i}].options.metadata: file not found: {path}")


def _check_repeats(pipeline: Pipeline, problems: list[str]) -> None:
    """``mixture.<source>.repeat``: ranges of a bucket that a classify stage makes, within its count."""
    buckets: dict[str, tuple[int, list[str]]] = {}  # bucket name -> (count, source kinds), of each classify stage with buckets
    for kind, opts in pipeline.stage_options:
        spec = getattr(opts, "buckets", None) if kind == "classify" else None
        if spec is not None:
            buckets.update(
                dict.fromkeys([*getattr(opts, "models", {}), spec.name], (spec.count, list(getattr(opts, "kinds", []))))
            )
    kinds = {s.name: s.kind for s in pipeline.config.sources}
    for key, entry in (pipeline.config.mixture or {}).items():
        if not isinstance(entry, MixtureEntry) or not entry.repeat:
            continue
        count, scored = buckets.get(entry.bucket, (None, []))
        if count is None:
            allowed = f"allowed: {', '.join(buckets)}" if buckets else "no classify stage with buckets makes one"
            problems.append(f"mixture.{key}.bucket: {entry.bucket!r} is not a classify bucket; {allowed}")
        elif key in kinds and kinds[key] not in scored:  # its documents would have no bucket: every count 1
            problems.append(
                f"mixture.{key}.repeat: source {key} is of kind {kinds[key]!r}, which the classify stage making "
                f"bucket_{entry.bucket} skips (its kinds: {', '.join(scored)}), so its documents have no bucket"
            )
        problems.extend(repeat_problems(f"mixture.{key}", entry, count))


def _check_semantics(pipeline: Pipeline, problems: list[str], names: list[str] | None = None) -> None:
    """Checks across sections; ``names``: the source names as written (default: the config's)."""
    config = pipeline.config
    names = [s.name for s in config.sources] if names is None else names
    for name in {n for n in names if names.count(n) > 1}:
        problems.append(f"sources: the name {name!r} is used by more than one source; names must be unique")
    if config.mixture is not None:
        weights = mixture_weights(config.mixture)
        for key, weight in weights.items():
            if key not in names:
                unused = [n for n in names if n not in config.mixture]  # a name already weighted is not the one meant
                problems.append(f"mixture.{key}: not a source name{did_you_mean(key, unused)}; sources are: {', '.join(names)}")
            if not weight >= 0:
                problems.append(f"mixture.{key}: {weight} is not allowed: weights must be >= 0")
        if config.mixture and sum(weights.values()) <= 0:
            problems.append("mixture: the weights must not all be 0")
        _check_repeats(pipeline, problems)
    _check_declared_licenses(pipeline, problems)
    if config.tokenize is not None:
        path = pipeline.resolve(config.tokenize.tokenizer)
        if not path.is_file():
            problems.append(f"tokenize.tokenizer: file not found: {path}")
        else:
            from datapipe.tokens.encode import TokenizerError, load_tokenizer_info

            try:
                load_tokenizer_info(path, config.tokenize)
            except TokenizerError as exc:
                problems.append(f"tokenize.{exc.key}: {exc}")


def _check_declared_licenses(pipeline: Pipeline, problems: list[str]) -> None:
    """``sources[i].license`` must be an SPDX expression of known ids; a declared licence needs the
    license stage (it is what writes ``license``); ``license_field`` needs records with fields."""
    from datapipe.license.expression import ExpressionError, declared_expression
    from datapipe.readers import READER_SPECS, reader_spec

    has_stage = any(kind == "license" for kind, _ in pipeline.stage_options)
    for i, src in enumerate(pipeline.config.sources):
        if src.license is not None:
            try:
                declared_expression(src.license)
            except ExpressionError as exc:
                problems.append(
                    f"sources[{i}].license: {exc}; expected an SPDX expression such as CC-BY-SA-4.0 or MIT OR Apache-2.0"
                )
        for key in ("license", "license_field"):
            if getattr(src, key) is not None and not has_stage:
                problems.append(
                    f"sources[{i}].{key}: declared licences are applied by the license stage; add `- license: {{}}` to stages"
                )
        if src.license_field is not None:
            formats = {fmt for _, fmt in pipeline.inputs.get(src.name, [])}
            if other := sorted(f for f in formats if not reader_spec(f).named_fields):
                named = [f for f in READER_SPECS if READER_SPECS[f].named_fields]
                problems.append(
                    f"sources[{i}].license_field: read from records with named fields ({', '.join(named)}) only; "
                    f"this source has {', '.join(other)} inputs"
                )


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None
