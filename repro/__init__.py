"""Multi-rank reproducers of the ZeRO-3 sequence-parallel gradient-scale bug."""
