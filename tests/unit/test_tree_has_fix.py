"""tree_has_fix / source_has_fix on code snippets shaped like DeepSpeed's stage3.py (fast)."""

from __future__ import annotations

import re

import pytest

from patch_and_test.core import errors
from patch_and_test.core.series import STAGE3, tree_has_fix
from repro.harness.fixed import source_has_fix

HEAD = """
class DeepSpeedZeroOptimizer_Stage3(ZeROOptimizer):

    def __init__(self):
        self.sequence_parallel_size = groups._get_sequence_parallel_world_size()

    def __avg_scatter_contiguous_grads(self, buffer_to_reduce, communication_data_type):
        world_sz = dist.get_world_size(self.dp_process_group)
        buffer_to_reduce.div_(world_sz / float(self.sequence_parallel_size))

    def _gradient_averaging_world_size(self, params, partition_world_size):
        return partition_world_size
"""

# v0.14-v0.19.2: no rescale at all.
OLD_UNFIXED = HEAD + """
    def __avg_scatter_grads(self, params_to_reduce, communication_data_type):
        \"\"\"average gradients and scatter partitions across ranks (sequence_parallel_size is ignored)\"\"\"
        full_grads_for_rank = [p.grad for p in params_to_reduce]
        grad_partitions_for_rank = reduce_scatter_coalesced(full_grads_for_rank, self.dp_process_group)
        # TODO: account for self.sequence_parallel_size
        return grad_partitions_for_rank
"""

# The backport series' fix.
OLD_FIXED = OLD_UNFIXED.replace(
    "        # TODO: account for self.sequence_parallel_size\n", """
        partition_world_size = dist.get_world_size(group=self.dp_process_group)
        averaging_world_size = partition_world_size / float(self.sequence_parallel_size)
        if averaging_world_size != partition_world_size:
            scale = partition_world_size / float(averaging_world_size)
            grad_partitions_for_rank = [g.mul(scale) for g in grad_partitions_for_rank]
""")

# v0.19.3 to master: the AutoEP rescale, without sp.
MASTER_UNFIXED = HEAD + """
    def __avg_scatter_grads(self, params_to_reduce, communication_data_type):
        process_group = self._get_param_partition_group(params_to_reduce[0])
        grad_partitions_for_rank = reduce_scatter_coalesced([p.grad for p in params_to_reduce], process_group)
        partition_world_size = dist.get_world_size(group=process_group)
        averaging_world_size = self._gradient_averaging_world_size(params_to_reduce, partition_world_size)
        if averaging_world_size != partition_world_size:
            scale = partition_world_size / float(averaging_world_size)
            grad_partitions_for_rank = [g.mul(scale) for g in grad_partitions_for_rank]
        return grad_partitions_for_rank

    def _get_param_partition_group(self, param):
        return getattr(param, "ds_process_group", self.dp_process_group)
"""

# The master series' fix, as yapf wraps it.
MASTER_FIXED = MASTER_UNFIXED.replace(
    "self._gradient_averaging_world_size(params_to_reduce, partition_world_size)\n",
    "self._gradient_averaging_world_size(params_to_reduce, partition_world_size) / float(\n"
    "            self.sequence_parallel_size)\n")


def test_unfixed_shapes():
    assert not source_has_fix(OLD_UNFIXED)  # the docstring and the comment name it: not code
    assert not source_has_fix(MASTER_UNFIXED)  # the contiguous path has sp: another function


def test_fixed_shapes():
    assert source_has_fix(OLD_FIXED)
    assert source_has_fix(MASTER_FIXED)


def test_fix_written_another_way():
    # e.g. upstream asks the groups module instead of the cached attribute
    other = MASTER_UNFIXED.replace(
        "averaging_world_size = self._gradient_averaging_world_size(params_to_reduce, partition_world_size)",
        "averaging_world_size = self._gradient_averaging_world_size(params_to_reduce, partition_world_size) "
        "// groups._get_sequence_parallel_world_size()")
    assert source_has_fix(other)


def test_fix_in_a_helper_the_function_calls():
    # upstream may fold sp into _gradient_averaging_world_size; one level of self.* calls is read
    helper = MASTER_UNFIXED.replace("        return partition_world_size\n",
                                    "        return partition_world_size / float(self.sequence_parallel_size)\n")
    assert source_has_fix(helper)


def test_helpers_not_called_do_not_count():
    # __init__ and the contiguous path name sp, but __avg_scatter_grads does not call them
    assert not source_has_fix(HEAD + "\n    def __avg_scatter_grads(self):\n        return []\n")


def test_function_missing_or_outside_a_class():
    assert not source_has_fix(HEAD)
    assert not source_has_fix("def __avg_scatter_grads(self):\n    return self.sequence_parallel_size\n")


def test_tree_has_fix_reads_stage3(tmp_path):
    path = tmp_path / STAGE3
    path.parent.mkdir(parents=True)
    path.write_text(MASTER_UNFIXED)
    assert not tree_has_fix(tmp_path)
    path.write_text(MASTER_FIXED)
    assert tree_has_fix(tmp_path)
    path.write_text("def broken(:\n")
    with pytest.raises(errors.BadInput, match="does not parse"):
        tree_has_fix(tmp_path)


def test_tree_without_stage3(tmp_path):
    with pytest.raises(errors.BadInput, match="not a DeepSpeed source tree"):
        tree_has_fix(tmp_path)


def test_the_real_fix_patches_add_code_naming_sp(manifest):
    # What tree_has_fix looks for must be in the code (not a comment) each fix patch adds; the
    # network and mirror tests check tree_has_fix on real trees before and after.
    for series in manifest.series:
        added = re.findall(r"^\+(?!\+\+)(.*)$", series.fix_patches[0].path.read_text(), re.M)
        code = [line.split("#", 1)[0] for line in added]
        assert any("self.sequence_parallel_size" in line for line in code), series.name
