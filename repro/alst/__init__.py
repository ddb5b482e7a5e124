"""The ALST recipe check (``repro/alst_recipe.py``): the gradient scale of DeepSpeed's ALST / Ulysses-HF loss recipe,
ZeRO-2 and ZeRO-3. Roles as in every family; see docs/alst-recipe.md."""
