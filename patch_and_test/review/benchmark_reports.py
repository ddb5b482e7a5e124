"""The benchmarks' result models (schemas in docs/schemas/); here in the package because review reads the files."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ConfigDict

from repro.harness.report import JsonReport, Record

Load = list[float]


class Environment(Record):
    python: str
    deepspeed: str
    torch: str
    platform: str
    cpus: int | None
    load_average_at_start: Load


class ResultFile(JsonReport):
    FILES: ClassVar[str]

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        return super().from_dict({"schema": cls.SCHEMA, **data})  # the kept runs have no schema key


class Benchmark(ResultFile):
    benchmark: str


class Targeted(Benchmark):
    """One number against one target: exit 0 when it is met."""
    environment: Environment
    target: float
    meets_target: bool


class Timed(Record):
    argv: list[str]
    returncode: int
    wall_s: float
    teardown_notes: int
    stderr_tail: str


class LaunchCost(Targeted):
    SCHEMA = "zero3-sp-gradfix/benchmark-launch-cost/v1"
    FILES = "launch_cost*.json"
    repeats: int
    median_wall_s: dict[str, float]
    ratio_all_six_over_single: float
    runs: dict[str, list[Timed]]


class BundleReuse(Targeted):
    SCHEMA = "zero3-sp-gradfix/benchmark-bundle-reuse/v1"
    FILES = "bundle_reuse*.json"
    first_build_s: float
    first_build_summary: str
    first_run_s_given: float | None
    second_build_s: float
    second_build_summary: str
    ratio_second_over_first: float


class PipelineOverhead(Targeted):
    SCHEMA = "zero3-sp-gradfix/benchmark-pipeline-overhead/v1"
    FILES = "pipeline_overhead*.json"
    version: str
    warm: bool
    pipeline_wall_s: float
    pipeline_steps_s: dict[str, float]
    launches_s: dict[str, float]
    launches_total_s: float
    overhead_s: float
    ratio_total_over_launches: float
    verdict: str


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
    exit: int | None
    message_has: str


class Launch(Ended):
    kind: str
    script: str
    exit_code: int | None
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
    pytest: list[str]
    log: str


class TestCommand(Benchmark):
    __test__ = False
    SCHEMA = "zero3-sp-gradfix/benchmark-test-command/v1"
    FILES = "test_command*.json"
    command: str
    commit: str
    cpus: int | None
    targets_s: dict[str, float]
    runs: dict[str, CommandRun]
    meets_targets: bool


Checks = dict[str, bool | float | None]


class LaunchInfo(Record):
    phase: str
    master_addr: str | None
    master_port: str | None
    world_size: int
    sp: int
    dp: int
    backend: str
    wall_s: float
    load_average_at_end: Load

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
    step_times_s: dict[str, list[float]]
    cpu_times_s: dict[str, list[float]]
    rank_median_s: list[dict[str, float]]
    isolated_post_scale: list[PostScale]
    allocations: list[dict[str, Allocation]]
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
    paths: dict[str, Errors]
    bitwise_equal_all_ranks: dict[str, bool]


class NumericsResult(Record):
    dtype: str
    param_names: dict[int, str]
    communication_dtype: str
    gradient_dtype: str
    elements: int
    kinds: dict[str, KindResult]


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
    wall_ms: dict[str, Quantiles]
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


class NumericsRow(Errors):
    world: int
    sp: int
    dp: int
    dtype: str
    kind: str
    path: str


class BitwiseRow(Record):
    """One layout, dtype and input kind; every other key is a pair of paths ("contiguous==avg_scatter[x]")."""
    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, bool]
    world: int
    sp: int
    dp: int
    dtype: str
    kind: str


class RunInfo(Record):
    started: str
    load_average_at_start: Load
    waited_for_load_s: float
    load_average_at_end: Load | None = None
    launches: int | None = None
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
    tree: str | None = None
    backend: str
    waited_for_load_s: float
    patches: dict[str, str]
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
    meets_target: bool | None = None
    divisor_at_least_as_exact_as_rescale: bool | None = None
    conclusion: str
