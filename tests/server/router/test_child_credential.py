"""A router child's credential (``secrets.token_urlsafe``, so it may begin with ``-``) reaches the
child through ``LLAMA_API_KEY`` and must parse as the key's value, not as a flag: one router start
in 64 used to lose its first child to ``argument --api-key: expected one argument``."""

from __future__ import annotations

import pytest

from mlxcel.server.cli.args import parse_args
from mlxcel.server.router.child_access import child_env


@pytest.mark.parametrize("credential", ["-leading-dash", "--double", "plain_key"])
def test_a_credential_that_looks_like_a_flag_is_still_the_key(credential):
    config = parse_args(["--port", "0"], environ=child_env(credential, {}))
    assert config.api_keys() == [credential]


def test_any_environment_value_may_begin_with_a_dash():
    assert parse_args([], environ={"LLAMA_ARG_ALIAS": "-odd-name"}).alias == "-odd-name"
