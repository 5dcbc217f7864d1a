"""The one error of grammar-constrained decoding, in a module of its own so that the grammar's
limits, its big-stack runner and its compiler can all raise it without importing one another
(``grammar.GrammarError`` is the same class)."""

from __future__ import annotations

from mlxcel.engine.errors import MlxcelError


class GrammarError(MlxcelError):
    """A grammar or schema that cannot be compiled (invalid, or past a limit of
    ``grammar_limits``), or a matcher that can go no further."""
