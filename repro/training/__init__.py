"""The training-level effect (``repro/training_effect.py``): loss and gradient norm over a short real run, ZeRO-2 and
ZeRO-3, both loss recipes. Roles as in every family; ``figure`` draws the kept reports."""
