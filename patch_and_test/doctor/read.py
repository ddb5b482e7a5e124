"""What the doctor reads: the installed DeepSpeed's code (never imported), the user's config, the model's sizes,
the clients (docs/doctor.md, "What it reads"). Every failure is a ``BadInput`` with one line (exit 2).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from patch_and_test.doctor import rule
from patch_and_test.doctor.rule import PATH_KEYS, ZEROPP_KEYS, DeepSpeedState, LossSource, ZeroSettings
from patch_and_test.core.errors import BadInput
from patch_and_test.downstream.clients import FoundClient, found_clients
from repro.harness.env import dist_version
from repro.harness.report import error_line
from repro.harness.fixed import source_has_fix
from repro.downstream.expect import ARCTIC_LOSS, MARKER_NAME, VIA_CLIENTS

STAGE3 = Path("runtime") / "zero" / "stage3.py"
ZERO_CONFIG = Path("runtime") / "zero" / "config.py"
CONSTANTS = Path("runtime") / "constants.py"

# DeepSpeed's defaults (DeepSpeedZeroConfig's fields, runtime/constants.py), the same from 0.14 to 0.19.8;
# used only for a key the code reader cannot find. docs/doctor.md lists them.
DOCUMENTED_DEFAULTS: dict[str, Any] = dict(stage=0, reduce_scatter=True, contiguous_gradients=True,
                                           reduce_bucket_size=500_000_000, zero_quantized_gradients=False,
                                           zero_quantized_weights=False, zero_hpz_partition_size=1,
                                           gradient_predivide_factor=1.0, prescale_gradients=False)
TOP_LEVEL = dict(gradient_predivide_factor="GRADIENT_PREDIVIDE_FACTOR_DEFAULT",
                 prescale_gradients="PRESCALE_GRADIENTS_DEFAULT")
# zero_optimization keys HF's integration fills from "auto" with the model's hidden size
# (transformers' HfTrainerDeepSpeedConfig.trainer_config_finalize): reduce_bucket_size = hidden_size**2.
HF_HIDDEN_SIZE_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")


@dataclasses.dataclass(frozen=True)
class InstalledDeepSpeed:
    state: DeepSpeedState
    package: Path  # the deepspeed/ folder read
    defaults: dict[str, Any]
    defaults_from: dict[str, str]  # key -> where its default was read


def find_deepspeed(src: Path | None = None) -> InstalledDeepSpeed:
    """The DeepSpeed this interpreter would import (or the tree ``src``), read from its files."""
    if src is not None:
        package = src / "deepspeed" if (src / "deepspeed").is_dir() else src
        if not (package / STAGE3).is_file():
            raise BadInput(f"{src} is not a DeepSpeed tree: no {package / STAGE3}")
        version = _tree_version(package)
    else:
        spec = importlib.util.find_spec("deepspeed")
        if spec is None or not spec.origin:
            raise BadInput(f"deepspeed is not installed in this Python ({sys.executable}); or pass --deepspeed DIR")
        package = Path(spec.origin).parent
        version = dist_version("deepspeed") or _tree_version(package)
    stage3 = package / STAGE3
    try:
        source = stage3.read_text()
        fixed = source_has_fix(source)
    except (OSError, SyntaxError, UnicodeDecodeError) as err:
        raise BadInput(f"cannot read DeepSpeed's {stage3}: {type(err).__name__}: {err}") from None
    return InstalledDeepSpeed(DeepSpeedState(version, fixed, marker_set(source)), package, *read_defaults(package))


def _tree_version(package: Path) -> str:
    for candidate in (package.parent / "version.txt", package / "version.txt"):
        if candidate.is_file():
            return candidate.read_text().strip()
    raise BadInput(f"cannot read the version of the DeepSpeed at {package} (no package metadata, no version.txt)")


def marker_set(stage3_source: str) -> bool:
    """Whether the module sets ``ZERO3_SP_GRADIENTS_SUMMED = True`` at top level (code, not comments)."""
    for node in ast.parse(stage3_source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == MARKER_NAME for t in node.targets):
            return isinstance(node.value, ast.Constant) and node.value.value is True
    return False


def read_defaults(package: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The defaults DeepSpeed's code gives the keys the rule reads; the documented ones where it cannot be read."""
    found: dict[str, Any] = {}
    for path, reader in ((package / ZERO_CONFIG, zero_config_defaults), (package / CONSTANTS, constants_defaults)):
        try:
            found.update(reader(path.read_text()))
        except (OSError, SyntaxError, UnicodeDecodeError):
            pass
    values = {key: found.get(key, documented) for key, documented in DOCUMENTED_DEFAULTS.items()}
    shown = {key: f"deepspeed/{CONSTANTS if key in TOP_LEVEL else ZERO_CONFIG}" for key in found}
    return values, {key: shown.get(key, "documented (docs/doctor.md)") for key in DOCUMENTED_DEFAULTS}


def zero_config_defaults(source: str) -> dict[str, Any]:
    """Field defaults of ``DeepSpeedZeroConfig`` for the keys the rule reads, from ``runtime/zero/config.py``."""
    tree = ast.parse(source)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    enums = {f"{name}.{k}": v for name, cls in classes.items() for k, v in _constants(cls.body).items()}
    cls = classes.get("DeepSpeedZeroConfig")
    out: dict[str, Any] = {}
    for stmt in cls.body if cls else ():
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None \
                and stmt.target.id in PATH_KEYS + ZEROPP_KEYS:
            try:
                out[stmt.target.id] = _literal(stmt.value, enums)
            except ValueError:
                continue
    return out


def _literal(node: ast.AST, enums: dict[str, Any]) -> Any:
    """A default as DeepSpeed writes one: a constant, ``Field(x, ...)``, ``pp_int(5e8)``, ``Enum.member``."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        key = f"{node.value.id}.{node.attr}"
        if key in enums:
            return enums[key]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "Field":
            given = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "default"), None)
            if given is not None:
                return _literal(given, enums)
        elif node.func.id in ("pp_int", "int") and len(node.args) == 1:
            return int(_literal(node.args[0], enums))
    raise ValueError(f"not a literal default: {ast.dump(node)[:80]}")


def _constants(body: list[ast.stmt]) -> dict[str, Any]:
    """``NAME = <constant>`` assignments of a module or class body (a later one wins)."""
    return {
        t.id: s.value.value
        for s in body if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant) for t in s.targets
        if isinstance(t, ast.Name)
    }


def constants_defaults(source: str) -> dict[str, Any]:
    found = _constants(ast.parse(source).body)
    return {key: found[name] for key, name in TOP_LEVEL.items() if name in found}


def load_config(path: Path, yaml_file: bool = False) -> dict[str, Any]:
    """A config file: YAML where ``yaml_file``, else JSON (as HF's integration and accelerate read it), else hjson
    (as DeepSpeed reads it)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BadInput(f"no such config: {path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise BadInput(f"cannot read the config {path}: {err}") from None
    if yaml_file:
        data = _yaml(path, text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            try:
                import hjson

                data = hjson.loads(text)
            except Exception:  # noqa: BLE001 - no hjson, or any hjson failure: not a config
                data = None
            if data is None:
                raise BadInput(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        expected = "a YAML mapping" if yaml_file else "a JSON object"
        raise BadInput(f"{path} is not a config: {expected} is expected, got {type(data).__name__}")
    return data


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if value in (0, 1):
        return bool(value)
    raise BadInput(f"zero_optimization.{key} must be true or false, got {value!r}")


def _int(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool):
        raise BadInput(f"{key} must be an integer, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or value < minimum:
        raise BadInput(f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def zero_settings(config: dict[str, Any], defaults: dict[str, Any], defaults_from: dict[str, str],
                  hidden_size: int | None) -> ZeroSettings:
    """The ZeRO knobs DeepSpeed will run with: the config's, DeepSpeed's defaults, HF's "auto" fill."""
    zero = config.get("zero_optimization", {})
    if isinstance(zero, bool):  # DeepSpeed's deprecated form: true is stage 1
        zero = {"stage": 1 if zero else 0}
    if not isinstance(zero, dict):
        raise BadInput(f"zero_optimization must be an object, got {type(zero).__name__}")
    values: dict[str, Any] = {}
    origin: list[tuple[str, str]] = []
    for key in PATH_KEYS + ZEROPP_KEYS:
        if key not in zero:
            values[key], how = defaults[key], f"default, {defaults_from[key]}"
        elif zero[key] != "auto":
            values[key], how = zero[key], "config"
        elif key not in HF_HIDDEN_SIZE_KEYS:
            raise BadInput(f'zero_optimization.{key} is "auto", which HF\'s integration does not fill: give a value')
        elif hidden_size is not None:
            values[key] = hidden_size * hidden_size
            how = f"auto: hidden_size^2 = {hidden_size}^2, as HF's integration fills it"
        else:
            values[key], how = None, "auto, unfilled: HF fills it with hidden_size^2 (pass --model)"
        origin.append((key, how))
    stage = _int("zero_optimization.stage", values["stage"], 0)
    if stage > 3:
        raise BadInput(f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage}")
    bucket = values["reduce_bucket_size"]
    top = {key: config.get(key, defaults[key]) for key in TOP_LEVEL}
    origin += [(key, "config" if key in config else f"default, {defaults_from[key]}") for key in TOP_LEVEL]
    try:
        predivide = float(top["gradient_predivide_factor"])
    except (TypeError, ValueError):
        raise BadInput(f"gradient_predivide_factor must be a number, got {top['gradient_predivide_factor']!r}") \
            from None
    return ZeroSettings(
        stage=stage, reduce_scatter=_bool("reduce_scatter", values["reduce_scatter"]),
        contiguous_gradients=_bool("contiguous_gradients", values["contiguous_gradients"]),
        reduce_bucket_size=None if bucket is None else _int("zero_optimization.reduce_bucket_size", bucket, 1),
        zero_quantized_gradients=_bool("zero_quantized_gradients", values["zero_quantized_gradients"]),
        zero_quantized_weights=_bool("zero_quantized_weights", values["zero_quantized_weights"]),
        zero_hpz_partition_size=_int("zero_optimization.zero_hpz_partition_size", values["zero_hpz_partition_size"],
                                     0), gradient_predivide_factor=predivide,
        prescale_gradients=_bool("prescale_gradients", top["prescale_gradients"]), origin=tuple(origin))


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What a config file says about the run: the DeepSpeed config it hands DeepSpeed and DeepSpeed's sp."""
    kind: str  # what the file is, as the output names it
    deepspeed: dict[str, Any]  # HF's "auto" values left for zero_settings to fill
    sp: int | None  # None: the file does not say
    sp_where: str  # the key that says it, or why none does
    loss: LossSource | None = None  # the loss code the file implies (ArcticTraining's trainer), if any
    notes: tuple[str, ...] = ()


def read_config(path: Path) -> RunConfig:
    """A DeepSpeed config, an accelerate config or an ArcticTraining config: YAML by the file's suffix (as accelerate
    tells its two formats apart), JSON else; the kind by its keys."""
    yaml_file = path.suffix.lower() in (".yaml", ".yml")
    data = load_config(path, yaml_file)
    if "distributed_type" in data:
        return accelerate_config(path, data)
    if "model" in data and "data" in data:
        return arctic_config(data)
    if yaml_file:
        raise BadInput(f"{path} is neither an accelerate config (no distributed_type) nor an ArcticTraining config "
                       "(no model and data); a DeepSpeed config is JSON")
    return deepspeed_config(data)


def deepspeed_config(data: dict[str, Any]) -> RunConfig:
    """A DeepSpeed config as HF's integration or DeepSpeed reads it; its sequence_parallel_size, if any."""
    value = data.get("sequence_parallel_size")
    if value is None or value == "auto":
        return RunConfig("DeepSpeed config", data, None, "the config has no sequence_parallel_size")
    return RunConfig("DeepSpeed config", data, _int("sequence_parallel_size", value, 1), "sequence_parallel_size")


def _yaml(path: Path, text: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise BadInput(f"reading {path} needs PyYAML (pip install pyyaml; accelerate and ArcticTraining depend on "
                       "it)") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise BadInput(f"{path} is not valid YAML: {getattr(err, 'problem', None) or error_line(err)}{where}") \
            from None


def _section(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise BadInput(f"{key} must be a mapping, got {type(value).__name__}")
    return value


# accelerate 1.16.0 (docs/doctor.md, "accelerate"): the keys DeepSpeedPlugin takes from its DeepSpeed config file
# instead, which accelerate refuses next to deepspeed_config_file (and a top-level mixed_precision).
ACCELERATE_FILE_ONLY = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                        "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                        "zero3_save_16bit_model")
ACCELERATE_ZERO_STAGE = 2  # DeepSpeedPlugin's zero_stage when nothing sets it


def accelerate_config(path: Path, data: dict[str, Any]) -> RunConfig:
    """What ``accelerate launch --config_file`` hands DeepSpeedPlugin and ParallelismConfig."""
    if data["distributed_type"] != "DEEPSPEED":
        raise BadInput(f"{path} is an accelerate config for distributed_type {data['distributed_type']}, not "
                       "DEEPSPEED: the run does not use DeepSpeed, whose bug this is")
    inline = _section(data, "deepspeed_config")
    notes = []
    file = inline.get("deepspeed_config_file")
    if file not in (None, "none"):
        refused = [k for k in ACCELERATE_FILE_ONLY if k in inline
                   ] + (["mixed_precision"] if "mixed_precision" in data else [])
        if refused:
            raise BadInput(f"accelerate refuses {', '.join(refused)} next to deepspeed_config_file (they belong in "
                           "the DeepSpeed config file)")
        ds = load_config(Path(file))  # HfDeepSpeedConfig opens the path as given
        if not Path(file).is_absolute():
            notes.append(f"deepspeed_config_file {file} read from the current directory, as accelerate opens it")
        zero = ds.get("zero_optimization")
        if not isinstance(zero, dict):
            raise BadInput(f"{file}: accelerate needs a zero_optimization object in the DeepSpeed config file")
        if zero.get("stage") == "auto":
            zero["stage"] = ACCELERATE_ZERO_STAGE
            notes.append(f'zero_optimization.stage "auto": accelerate fills it with {ACCELERATE_ZERO_STAGE}, its '
                         "default zero_stage")
        kind = f"accelerate config with deepspeed_config_file {file}"
    else:
        stage = inline.get("zero_stage")
        if stage is None:
            stage = ACCELERATE_ZERO_STAGE
            notes.append(f"no zero_stage: accelerate's default, {ACCELERATE_ZERO_STAGE}")
        ds = {"zero_optimization": {"stage": stage}}  # what DeepSpeedPlugin builds, less what the rule ignores
        kind = "accelerate config, inline deepspeed_config"
    parallelism = _section(data, "parallelism_config")
    if not parallelism:
        return RunConfig(kind, ds, None, "the accelerate config has no parallelism_config", notes=tuple(notes))
    sp = _int("parallelism_config_sp_size", parallelism.get("parallelism_config_sp_size", 1), 1)
    backend = parallelism.get("parallelism_config_sp_backend", "deepspeed")
    if backend != "deepspeed":
        notes.append(f"parallelism_config_sp_backend {backend}, not deepspeed: DeepSpeed gets no sp from accelerate "
                     "(sp 1); accelerate 1.16.0 itself refuses any backend but deepspeed")
        return RunConfig(kind, ds, 1, "parallelism_config_sp_backend (not deepspeed)", notes=tuple(notes))
    return RunConfig(kind, ds, sp, "parallelism_config_sp_size", notes=tuple(notes))


# ArcticTraining 0.8.0 (docs/doctor.md, "ArcticTraining"): its zero_optimization where the deepspeed: section has
# none (reduce_bucket_size: hidden_size^2, HF's "auto" fill), and the trainer types whose loss is SFTTrainer.loss.
ARCTIC_ZERO = {"stage": 2, "reduce_bucket_size": "auto"}
ARCTIC_SFT_LOSS = ("sft", "causal")


def arctic_config(data: dict[str, Any]) -> RunConfig:
    """What ArcticTraining's TrainerConfig hands DeepSpeed, and its trainer's loss."""
    ds = {key: _human(value) for key, value in _section(data, "deepspeed").items()}
    notes = []
    if "zero_optimization" not in ds:
        ds["zero_optimization"] = dict(ARCTIC_ZERO)
        notes.append("deepspeed: has no zero_optimization: ArcticTraining's default, stage 2")
    stated = "sequence_parallel_size" in data
    sp = _int("sequence_parallel_size", data.get("sequence_parallel_size", 1), 1)
    trainer = data.get("type", "sft")
    loss = None
    if trainer in ARCTIC_SFT_LOSS:
        loss = LossSource(f"ArcticTraining's SFTTrainer.loss ({trainer} trainer)", ARCTIC_LOSS, "arctic_training")
    else:
        notes.append(f"trainer type {trainer}: not a trainer whose loss the doctor knows (--recipe says yours)")
    where = "sequence_parallel_size" if stated else "sequence_parallel_size (absent: ArcticTraining's default)"
    return RunConfig("ArcticTraining config", ds, sp, where, loss, tuple(notes))


_HUMAN = re.compile(r"^(-?\d+\.?\d?)(?:(e|\^)(-?\d+\.?\d?)|(ki|mi|gi|ti|k|m|b|t))$")
_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def _human(value: Any) -> Any:
    """A deepspeed: value as ArcticTraining reads it: strings such as 5e8, 2^20, 500M, 10% become numbers."""
    if isinstance(value, dict):
        return {key: _human(v) for key, v in value.items()}
    if not isinstance(value, str):
        return value
    text = value.replace("_", "").lower().strip()
    found = _HUMAN.match(text)
    try:
        if text.endswith("%"):
            return float(text[:-1]) / 100
        if found and found.group(4):
            return float(found.group(1)) * _SUFFIX[found.group(4)]
        if found:
            base, exp = float(found.group(1)), float(found.group(3))
            return base * 10**exp if found.group(2) == "e" else (-1 if base < 0 else 1) * abs(base)**exp
        return float(text)
    except ValueError:
        return value


def sequence_parallel_size(run: RunConfig, given: int | None, path: Path) -> int:
    """The file's sp, else --sp (diagnose has refused one < 1); a --sp that disagrees with the file is an error."""
    if run.sp is None:
        if given is None:
            raise BadInput(f"pass --sp N ({run.sp_where})")
        return given
    if given is not None and given != run.sp:
        raise BadInput(f"--sp {given} disagrees with {path}: {run.sp_where} is {run.sp}, the sp DeepSpeed gets")
    return run.sp


@dataclasses.dataclass(frozen=True)
class ModelSizes:
    label: str
    params: tuple[tuple[str, int], ...]  # (name, elements), as DeepSpeed sees them (tied ones once)
    hidden_size: int | None


def parse_param_sizes(text: str) -> ModelSizes:
    sizes = []
    for i, item in enumerate(text.split(","), 1):
        try:
            sizes.append((f"param{i}", _int("--param-sizes", item.strip(), 1)))
        except BadInput:
            raise BadInput(f"--param-sizes takes element counts separated by commas, got {item.strip()!r}") from None
    return ModelSizes(f"{len(sizes)} parameter sizes given", tuple(sizes), None)


def hidden_size_of(config: Any) -> int | None:
    """The hidden size the way HF's integration picks it (trainer_config_finalize)."""
    for holder in (config, getattr(config, "text_config", None)):  # no text_config: None, which has neither
        if getattr(holder, "hidden_size", None) is not None:
            return int(holder.hidden_size)
        if getattr(holder, "hidden_sizes", None):
            return int(max(holder.hidden_sizes))
    return None


def model_sizes(spec: str) -> ModelSizes:
    """A transformers config (file, folder or hub name) built on the meta device: its parameters' sizes."""
    try:
        import torch
        import transformers
    except ImportError as err:
        raise BadInput(f"--model needs torch and transformers ({err}); or pass --param-sizes") from None
    try:
        config = transformers.AutoConfig.from_pretrained(spec)
    except Exception as err:  # noqa: BLE001 - any failure to find or parse it is bad input
        raise BadInput(f"cannot read a transformers config from {spec!r}: {error_line(err)}") from None
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        try:
            with torch.device("meta"):
                model = auto.from_config(config)
            break
        except Exception as err:  # noqa: BLE001
            problem = error_line(err)
    else:
        raise BadInput(f"cannot build {spec!r} on the meta device: {problem}")
    params = tuple((name, int(p.numel())) for name, p in model.named_parameters())
    return ModelSizes(f"{type(model).__name__} from {spec}", params, hidden_size_of(config))


def _code(relative: str) -> str | None:
    top, _, rest = relative.partition("/")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / rest
    return path.read_text(errors="replace") if path.is_file() else None


def installed_clients() -> list[tuple[FoundClient, LossSource | None]]:
    """The installed clients with sp loss code, read as ``patch-and-test``'s client check reads them, each with the
    loss code the doctor judges it by (None: not judged: no sp loss code, an example script, not in the rule yet)."""
    from repro.downstream.measure import ACCELERATE_SCRIPT

    judged: dict[str, tuple[FoundClient, LossSource | None]] = {}
    for c in found_clients():
        if c.kind is not None and c.function == ACCELERATE_SCRIPT:
            c = dataclasses.replace(
                c, kind=None, note=f"no sp loss code of its own; its ALST example script's recipe is {c.kind.kind} "
                f"(for a training loop copied from it: --recipe {c.kind.kind})")
        judged[c.name] = c, None if c.kind is None else LossSource(f"{c.name} {c.version}", c.kind, c.name)
    for via in VIA_CLIENTS:
        version = dist_version(via.dist)
        if version is None or judged.get(via.name, (None, None))[1] is not None:
            continue  # not installed, or judged from its own entry to the loss already: one row a client
        # Else the hand-off, read from its code, judges it (in its own entry's place, if it has one).
        base = judged.get(via.base, (None, None))[1]
        code = _code(via.code_file)
        if code is None or not all(needle in code for needle in via.hands_off):
            why = f"its {via.code_file} does not hand the loss to {via.base}"
            judged[via.name] = FoundClient(via.dist, version, via.code_file, None, why), None
        elif base is None:
            why = f"it {via.how}, and {via.base} has no sp loss code here"
            judged[via.name] = FoundClient(via.dist, version, via.code_file, None, why), None
        else:
            kind = via.handed_on(base.kind)
            judged[via.name] = (FoundClient(via.dist, version, via.code_file, kind, via.how),
                                LossSource(f"{via.dist} {version} (via {base.label})", kind, via.base))
    return list(judged.values())


@dataclasses.dataclass(frozen=True)
class Check:
    """One check, from what was read to the verdict: the command and the prediction tests share it."""

    zero: rule.ZeroSettings
    sp: int
    deepspeed: rule.DeepSpeedState
    sources: tuple[rule.LossSource, ...]
    verdict: rule.Verdict

    def prediction(self, numel: int | None, source: rule.LossSource | None = None) -> tuple[str, float]:
        """(reduce path, factor now) of a parameter with ``numel`` elements; the first loss source by default."""
        path = rule.reduce_path(self.zero, numel)
        if path is None:
            raise ValueError(f"the path of a {numel}-element parameter depends on a bucket size not known here")
        return str(path), rule.factor(path, self.sp, self.zero.stage, self.deepspeed, source or self.sources[0])


def run_check(config: dict[str, Any], sp: int, deepspeed: rule.DeepSpeedState, sources: Sequence[rule.LossSource],
              params: Sequence[tuple[str, int]] | None = None, hidden_size: int | None = None,
              defaults: dict[str, Any] | None = None, defaults_from: dict[str, str] | None = None) -> Check:
    """The doctor's reading of ``config`` for this DeepSpeed, loss code and parameters; BadInput as the command."""
    if defaults is None:
        defaults = DOCUMENTED_DEFAULTS
        defaults_from = {k: "documented (docs/doctor.md)" for k in defaults}
    z = zero_settings(config, defaults, defaults_from or {}, hidden_size)
    if z.bucket_decides and z.reduce_bucket_size is None:
        raise BadInput('zero_optimization.reduce_bucket_size is "auto" and decides the reduce path here: pass '
                       "--model (HF fills it with hidden_size^2) or give it a number")
    cells = rule.cells(z, rule.param_classes(z, params), sources, sp, deepspeed)
    return Check(z, sp, deepspeed, tuple(sources), rule.verdict(cells))
