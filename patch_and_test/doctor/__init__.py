"""``python -m patch_and_test.doctor``: does the ZeRO-3 sp gradient-scale bug touch my run, and what do I do?

Reads, without a GPU or a training step: the DeepSpeed installed here (its version, whether its
``stage3.py`` carries the fix and the capability marker, read from the code), the user's DeepSpeed
config (ZeRO stage and reduce knobs, DeepSpeed's defaults for missing keys, HF's ``"auto"`` values),
optionally the model's parameter sizes, and the installed clients' sp loss recipes. It prints, per class
of parameters, the reduce path DeepSpeed takes and the gradient factor (1 = the true gradient) now and
after the fix, a verdict and the remedy.

Modules: ``rule`` (pure: the path rule, the factors, the verdict, the remedy), ``read`` (what is read
from the environment and the files), ``cli`` (the command). Exit codes: 0 not affected, 1 affected,
2 bad input or nothing to decide with (one line on stderr).
"""
