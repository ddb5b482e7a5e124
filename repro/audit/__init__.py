"""The gradient-scale parity audit: its space, measurement, expectations, report and runner (repro/parity_audit.py)."""
