"""The gradient-scale family: what the two reporter-style reproducers measure, expect and report."""
