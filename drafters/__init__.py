"""Drafters: where speculative proposals come from, one sub-package or module per kind, each
implementing ``engine.speculative.drafter``'s interface; ``registry`` declares every kind once.
Depends on the engine only."""
