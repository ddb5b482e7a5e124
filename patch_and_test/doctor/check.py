"""One check, from what was read to the verdict: the function the command and the prediction tests share. Pure."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from patch_and_test.doctor import read, rule
from patch_and_test.core.errors import BadInput


@dataclasses.dataclass(frozen=True)
class Check:
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
        defaults = read.DOCUMENTED_DEFAULTS
        defaults_from = {k: "documented (docs/doctor.md)" for k in defaults}
    z = read.zero_settings(config, defaults, defaults_from or {}, hidden_size)
    if z.bucket_decides and z.reduce_bucket_size is None:
        raise BadInput('zero_optimization.reduce_bucket_size is "auto" and decides the reduce path here: pass '
                       "--model (HF fills it with hidden_size^2) or give it a number")
    classes = rule.param_classes(z, list(params) if params is not None else None)
    cells = rule.cells(z, classes, sources, sp, deepspeed)
    return Check(z, sp, deepspeed, tuple(sources), rule.verdict(cells))
