"""Speculative decoding: the drafter interface (``drafter``), acceptance rules, one verify
round, the per-sequence session that both ``mlxcel generate`` and the server scheduler run
(``session``), the acceptance report, and what model-based drafters need from the target
(hidden-state features, the block-versus-chain exactness probe)."""
