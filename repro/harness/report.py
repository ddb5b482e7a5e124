"""What every report of the package shares: a pydantic v2 model, JSON out, validated JSON in (derived fields
recomputed and checked); the JSON schemas are exported under docs/schemas/."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from repro.harness.files import write_json


class Record(BaseModel):
    """A nested record: derived fields are recomputed on load (older files worded some otherwise)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _derived_recomputed(cls, data: Any) -> Any:
        if isinstance(data, dict) and cls.model_computed_fields:
            data = {k: v for k, v in data.items() if k not in cls.model_computed_fields}
        return data


class JsonReport(BaseModel):
    """The base of every report: ``SCHEMA`` names it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=True)

    SCHEMA: ClassVar[str] = ""
    JSON_INDENT: ClassVar[int | None] = 2

    schema_name: str = Field("", alias="schema", description="the report's schema name and version")

    @model_validator(mode="before")
    @classmethod
    def _schema_matches(cls, data: Any) -> Any:
        if isinstance(data, dict):
            given = data.get("schema", data.get("schema_name"))
            if given in (None, ""):
                data = {**data, "schema": cls.SCHEMA}
            elif given != cls.SCHEMA:
                raise ValueError(f"not a {cls.SCHEMA} report: schema={given!r}")
        return data

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        """Validate ``data``; its derived fields, where present, must equal what the fields give."""
        if data.get("schema") != cls.SCHEMA:
            raise ValueError(f"not a {cls.SCHEMA} report: schema={data.get('schema')!r}")
        derived = {k: data[k] for k in cls.model_computed_fields if k in data}
        report = cls.model_validate({k: v for k, v in data.items() if k not in derived})
        for name, stored in derived.items():
            if getattr(report, name) != stored:
                raise ValueError(f"{cls.SCHEMA}: stored {name}={stored!r} but its rows give {getattr(report, name)!r}")
        return report

    @classmethod
    def load(cls, path: Path):
        return cls.from_dict(json.loads(Path(path).read_text()))

    def write(self, path: Path) -> None:
        write_json(path, self.to_dict(), indent=self.JSON_INDENT)

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        return {**cls.model_json_schema(by_alias=True, mode="serialization"), "$id": cls.SCHEMA}


class LaunchReport(JsonReport):
    """A report of one multi-rank launch; a family adds its rows, ``table()``, ``holds`` and ``outcome()``."""

    script: str
    deepspeed_version: str
    torch_version: str
    backend: str  # "gloo" | "nccl"
    device: str  # "cpu" | "cuda"
    launcher: str  # "local" (the script started its ranks) | "external" (torchrun, deepspeed)
    world_size: int
    sp: int
    dp: int
    expect: str  # "fixed" | "buggy"
    extra: dict[str, Any] = Field(default_factory=dict)
    python_version: str = Field(default_factory=platform.python_version)
    wall_time_s: float | None = None

    def table(self) -> str:
        raise NotImplementedError

    def versions(self) -> str:
        return f"DeepSpeed {self.deepspeed_version}, torch {self.torch_version}"

    def outcome(self) -> str:
        """What ``summary()`` adds after the verdict, in parentheses."""
        raise NotImplementedError

    def summary(self) -> str:
        line = (
            f"{self.script}: {self.versions()}, {self.backend}, world {self.world_size} (sp={self.sp}, "
            f"dp={self.dp}), --expect {self.expect}: {'HOLDS' if self.holds else 'DOES NOT HOLD'} {self.outcome()}")
        return line if self.wall_time_s is None else f"{line}, {self.wall_time_s:.1f} s"

    @classmethod
    def emit(cls, report_dict: dict[str, Any], wall_time_s: float, json_path: Path | None) -> None:
        report = cls.from_dict(report_dict)
        report.wall_time_s = round(wall_time_s, 3)
        print(report.table(), flush=True)
        if json_path is not None:
            report.write(json_path)


class PatternReport(LaunchReport):
    """``where(e)``: every row is where ``e`` puts it; gives ``pattern`` and, by default, ``holds``."""

    def where(self, expect: str) -> bool:
        raise NotImplementedError

    def _holds(self) -> bool:
        return self.where(self.expect)

    def outcome(self) -> str:
        return f"(pattern seen: {self.pattern})"

    @computed_field(description="--expect holds: every row where it puts it (and every loss ok, where there are any)")
    @property
    def holds(self) -> bool:
        return self._holds()

    @computed_field(description='"fixed" | "buggy" | "other": which expectation every row matches')
    @property
    def pattern(self) -> str:
        return next((e for e in ("fixed", "buggy") if self.where(e)), "other")

    @computed_field(description="0 holds, 1 does not")
    @property
    def exit_code(self) -> int:
        return 0 if self.holds else 1


def error_line(err: BaseException) -> str:
    """An exception as one line: its type and the last line of its text."""
    return f"{type(err).__name__}: {err}".strip().splitlines()[-1]  # never empty: the type's name leads


def text_table(header: Sequence[str], lines: Sequence[Sequence[str]],
               max_widths: Mapping[int, int] | None = None) -> list[str]:
    """Left-aligned columns under a header and a rule; column i at most ``max_widths[i]`` wide."""
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    widths = [min(w, (max_widths or {}).get(i, w)) for i, w in enumerate(widths)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header).rstrip(), fmt.format(*("-" * w for w in widths))]
    return out + [fmt.format(*line).rstrip() for line in lines]
