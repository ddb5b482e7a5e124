"""The training-level effect: loss and gradient norm over a short real run, ZeRO-2 and ZeRO-3, both loss recipes.

Roles as in every family: ``space`` (what runs), ``measure`` (the rank side), ``expect`` (the rule per
step), ``report`` (the typed JSON), ``run`` (the program); ``figure`` draws the kept reports.
"""
