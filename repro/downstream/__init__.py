"""Downstream clients (``repro/downstream_clients.py``): the gradient scale HF transformers', accelerate's,
ArcticTraining's, trl's and axolotl's own sp loss code gets from DeepSpeed. Roles as in every family; see
docs/downstream-notice.md and docs/backport-clients.md."""
