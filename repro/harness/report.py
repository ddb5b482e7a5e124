"""What every report of the package shares: a pydantic v2 model, JSON out, validated JSON in.

A family's report subclasses ``JsonReport``, sets ``SCHEMA`` (the name written in its ``schema``
field) and declares its fields; what it derives from them (``holds``, ``pattern``, ``exit_code``)
are ``computed_field`` properties, written to the JSON for readers without this package. Reading
a file back (``load`` / ``from_dict``) validates every field and recomputes the derived ones: a
file whose stored verdict disagrees with its own rows is rejected, not trusted. The JSON schema
of each report is exported under ``docs/schemas/`` (``python -m repro.harness.schemas``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from repro.harness.files import write_json


class Record(BaseModel):
    """A row or other nested record of a report: typed, immutable, no unknown fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class JsonReport(BaseModel):
    """The base of every report (see the module docstring)."""

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
        """The JSON schema of what ``write`` produces (derived fields included, read-only)."""
        schema = cls.model_json_schema(by_alias=True, mode="serialization")
        schema["$id"] = cls.SCHEMA
        return schema
