"""The ALST recipe check: the gradient scale of DeepSpeed's ALST / Ulysses-HF loss recipe, ZeRO-2 and ZeRO-3.

``space`` (what is checked: recipes, stages), ``expect`` (tolerances and the per-row verdict; the
expected scale itself is ``repro.harness.scales``' rule), ``measure`` (the rank side: the tiny
Llama, the baseline, one engine per stage and recipe), ``report`` (rows, report, table),
``run`` (the command line of ``repro/alst_recipe.py``); ``tiny_llama`` (the local model and the
offline hub cache, ``python -m repro.tiny_llama``) and ``optimizer_effect``
(``repro/alst_optimizer_effect.py``). See docs/alst-recipe.md.
"""
