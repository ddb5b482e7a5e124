"""The benchmarks' result models (schemas: docs/schemas/); here because review reads their files (bundle verify,
PR.md). ``bundle verify`` picks the model by file name (``FILES``). docs/code/benchmarks.md"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ConfigDict

from repro.harness.report import JsonReport, Record

Load = list[float]  # os.getloadavg(): 1, 5 and 15 minutes


class Environment(Record):
    python: str  # its version (runs before 2026-12-04 wrote the interpreter's path)
    deepspeed: str
    torch: str
    platform: str
    cpus: int | None
    load_average_at_start: Load


class ResultFile(JsonReport):
    FILES: ClassVar[str]  # the files this model reads (a Path.match pattern)

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        return super().from_dict({"schema": cls.SCHEMA, **data})  # the kept runs predate the schema key


class Benchmark(ResultFile):
    benchmark: str


class Targeted(Benchmark):
    """One number against one target: exit 0 when it is met."""
    environment: Environment
    target: float
    meets_target: bool


# -- launch_cost.py
class Timed(Record):
    argv: list[str]
    returncode: int
    wall_s: float
    teardown_notes: int  # "reported ... then exited with signal" lines: the abort at exit, absorbed
    stderr_tail: str


class LaunchCost(Targeted):
    SCHEMA = "zero3-sp-gradfix/benchmark-launch-cost/v1"
    FILES = "launch_cost*.json"
    repeats: int
    median_wall_s: dict[str, float]  # "all_six" | "single"
    ratio_all_six_over_single: float
    runs: dict[str, list[Timed]]


# -- bundle_reuse.py
class BundleReuse(Targeted):
    SCHEMA = "zero3-sp-gradfix/benchmark-bundle-reuse/v1"
    FILES = "bundle_reuse*.json"
    first_build_s: float
    first_build_summary: str
    first_run_s_given: float | None
    second_build_s: float
    second_build_summary: str
    ratio_second_over_first: float


# -- pipeline_overhead.py
class PipelineOverhead(Targeted):
    SCHEMA = "zero3-sp-gradfix/benchmark-pipeline-overhead/v1"
    FILES = "pipeline_overhead*.json"
    version: str
    warm: bool
    pipeline_wall_s: float
    pipeline_steps_s: dict[str, float]  # the verdict's step name -> its duration
    launches_s: dict[str, float]  # "before/<script>" -> the reproducer launch's duration
    launches_total_s: float
    overhead_s: float
    ratio_total_over_launches: float
    verdict: str


# -- stress_repro.py
class Counts(Record):
    launches: int
    false_reds: int
    hangs: int
    leaked_processes: int
    leaked_shm: int


class KindCounts(Counts):
    teardown_aborts_absorbed: int
    median_wall_s: float | None


class Ended(Record):
    wall_s: float
    leaked_processes: list[str]
    leaked_shm: list[str]
    stderr_tail: str


class Fault(Ended):
    fault: str
    handled: bool
    expected_exit: int
    exit: int | None  # None: hung
    message_has: str


class Launch(Ended):
    kind: str  # "2-rank", "4-rank", "torchrun" or a fault's name
    script: str
    exit_code: int | None  # None: hung (killed by the stress loop)
    expected: int
    teardown_aborts_absorbed: int

    @property
    def ok(self) -> bool:
        return self.exit_code == self.expected and not self.leaked_processes and not self.leaked_shm


class StressRepro(Benchmark):
    SCHEMA = "zero3-sp-gradfix/benchmark-stress-repro/v1"
    FILES = "stress_repro*.json"
    environment: Environment
    expect: str
    by_kind: dict[str, KindCounts]
    totals: Counts
    faults: list[Fault]
    not_ok_launches: list[Launch]
    ok: bool
    interrupted: bool
    wall_s: float


# -- test_command.py
class ToxEnv(Record):
    env: str
    status: str
    total_s: float
    setup_s: float
    cmd_s: float


class CommandRun(Record):
    exit_code: int
    wall_s: float
    load_average_at_start: Load
    load_average_at_end: Load
    envs: list[ToxEnv]
    pytest: list[str]  # pytest's summary lines
    log: str


class TestCommand(Benchmark):
    __test__ = False  # not a pytest class
    SCHEMA = "zero3-sp-gradfix/benchmark-test-command/v1"
    FILES = "test_command*.json"
    command: str
    commit: str
    cpus: int | None
    targets_s: dict[str, float]  # "cold" | "warm"
    runs: dict[str, CommandRun]
    meets_targets: bool


# -- reduce_path.py: one launch (reduce_path_launches/<run>/*.json)
Checks = dict[str, bool | float | None]  # "<impl>/before": median ratio, "<a>==<b> bitwise", "expected_ratio"


class LaunchInfo(Record):
    phase: str  # "timing" | "numerics"
    master_addr: str | None
    master_port: str | None
    world_size: int
    sp: int
    dp: int
    backend: str
    wall_s: float
    load_average_at_end: Load
    # added by the driver once the launch is over
    shm_buffers_removed: int | None = None
    load_average_at_start: Load | None = None
    driver_wall_s: float | None = None


class Bucket(Record):
    bucket_params: int
    bucket_elements: int
    communication_dtype: str
    gradient_dtype: str
    partition_world_size: int
    sequence_parallel_size: int
    itemsize: int


class Allocation(Record):
    method: str
    bytes: int
    count: int
    peak_bytes: int


class PostScale(Record):
    wall_median_s: float
    cpu_median_s: float
    repeats: int
    tensors: int
    elements: int


class TimedBucket(Bucket):
    checks: Checks
    step_times_s: dict[str, list[float]]  # impl -> per round, the slowest rank's
    cpu_times_s: dict[str, list[float]]  # impl -> per round, all ranks' CPU time
    rank_median_s: list[dict[str, float]]
    isolated_post_scale: list[PostScale]  # per rank
    allocations: list[dict[str, Allocation]]  # per rank, impl ->
    partition_elements: list[int]


class TimedCase(Record):
    case: str
    params: int
    numel_each: int
    dtype: str
    buckets: list[TimedBucket]


class Errors(Record):
    elements: int
    max_ulp: float
    mean_ulp: float
    exact_fraction: float
    correctly_rounded_fraction: float
    zero_oracle: int
    zero_oracle_missed: int
    scale: float | None


class KindResult(Record):
    paths: dict[str, Errors]  # "contiguous" | "avg_scatter[<impl>]" ->
    bitwise_equal_all_ranks: dict[str, bool]  # "<path>==<path>" ->


class NumericsResult(Record):
    dtype: str
    param_names: dict[int, str]
    communication_dtype: str
    gradient_dtype: str
    elements: int
    kinds: dict[str, KindResult]  # "exact" | "random" | "small" ->


class LaunchFile(ResultFile, LaunchInfo):
    """A reduce-path launch's own report (the ranks write it, the driver adds its fields)."""

    JSON_INDENT = 1


class TimingLaunch(LaunchFile):
    SCHEMA = "zero3-sp-gradfix/benchmark-reduce-path-timing-launch/v1"
    FILES = "reduce_path_launches/*/timing*.json"
    cases: list[TimedCase]


class NumericsLaunch(LaunchFile):
    SCHEMA = "zero3-sp-gradfix/benchmark-reduce-path-numerics-launch/v1"
    FILES = "reduce_path_launches/*/numerics-*.json"
    results: list[NumericsResult]


# -- reduce_path.py: the run (reduce_path.json, reduce_path-<version>.json)
class Spread(Record):
    p25: float
    p75: float
    p10: float
    p90: float


class Quantiles(Spread):
    median: float
    n: int


class PairedRatio(Spread):
    median_paired: float
    rounds: int
    ratio_of_medians: float
    per_launch_ratio_of_medians: list[float]


class IsolatedPostScale(Record):
    what: str
    wall_ms_slowest_rank: float
    cpu_ms_all_ranks: float
    share_of_before_wall: float
    share_of_before_cpu: float
    per_launch_wall_ms: list[float]


class ExtraBytes(Record):
    allocated: int
    allocating_events: int
    peak: int
    extra_vs_before: int
    extra_events_vs_before: int
    extra_peak_vs_before: int


class AnalyticBytes(Record):
    rescale: int
    rescale_new_tensors: int
    divisor: int
    divisor_new_tensors: int
    formula: str


class TimingRow(Record):
    case: str
    dtype: str
    params: int
    numel_each: int
    buckets: int
    bucket: Bucket
    wall_ms: dict[str, Quantiles]  # impl ->
    wall_ratio_vs_before: dict[str, PairedRatio]
    cpu_ms: dict[str, Quantiles]
    cpu_ratio_vs_before: dict[str, PairedRatio]
    isolated_post_scale: IsolatedPostScale
    bytes_rank0: dict[str, ExtraBytes]
    bytes_method: str
    analytic_extra_bytes_rank0: AnalyticBytes
    allocations_same_in_every_launch: bool
    checks: Checks
    checks_same_in_every_launch: bool


class Layout(Record):  # a numerics row's layout, communication dtype and input kind
    world: int
    sp: int
    dp: int
    dtype: str
    kind: str


class NumericsRow(Layout, Errors):  # Errors' fields first, then Layout's (the order the kept files have)
    path: str


class BitwiseRow(Layout):
    """One layout, dtype and input kind; every other key is a pair of paths ("contiguous==avg_scatter[x]")."""
    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, bool]


class RunInfo(Record):
    started: str
    load_average_at_start: Load
    waited_for_load_s: float
    load_average_at_end: Load | None = None
    launches: int | None = None  # timing only
    failed_launches: int | None = None
    added_launches: list[str] | None = None


class Target(Record):
    case: str
    max_ratio: float


class ReducePath(Benchmark):
    """Timing, numerics, or both (a run may skip either); a section it skipped is absent or null."""
    SCHEMA = "zero3-sp-gradfix/benchmark-reduce-path/v1"
    FILES = "reduce_path*.json"
    JSON_INDENT = 1
    environment: Environment
    tree: str | None = None  # recorded from 2026-12-04 on
    backend: str
    waited_for_load_s: float
    patches: dict[str, str]  # implementation -> the patch it is made of
    recommended: str
    target: Target
    impls: list[str]
    launch_reports: str
    timing_run: RunInfo | None = None
    timing: list[TimingRow] | None = None
    timing_launches: list[LaunchInfo] | None = None
    timing_raw: list[TimingLaunch] | None = None
    numerics_run: RunInfo | None = None
    numerics: list[NumericsRow] | None = None
    numerics_bitwise: list[BitwiseRow] | None = None
    numerics_launches: list[LaunchInfo] | None = None
    load_average_at_end: Load
    after_over_before: float | None = None
    paired_calls: int | None = None
    meets_target: bool | None = None  # timing only
    divisor_at_least_as_exact_as_rescale: bool | None = None  # with a "rescale" patch only
    conclusion: str
