"""Downstream clients: the gradient scale HF transformers', accelerate's and ArcticTraining's own sp loss
code gets from DeepSpeed.

``space`` (which clients, recipe kinds, gates and stages), ``expect`` (the rule: the client's
recipe kind and gate, read from its source, times DeepSpeed's reduction, through
``repro.harness.scales``), ``measure`` (the rank side: the installed clients' own loss functions
on real engines), ``report`` (rows, report, table), ``run`` (the command line of
``repro/downstream_clients.py``). See docs/downstream-notice.md and docs/backport-clients.md.
"""
