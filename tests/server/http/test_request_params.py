"""A ``samplers`` list that leaves stages out turns exactly those stages off."""

from __future__ import annotations

import pytest

from mlxcel.engine.sampling.params import SamplerParams
from mlxcel.server.http.request_params import apply_sampler_order
from mlxcel.server.runtime.errors import ApiError


def test_left_out_stages_become_no_ops_and_kept_ones_keep_their_values():
    params = {"top_k": 7, "top_p": 0.5, "min_p": 0.2, "typical_p": 0.9, "xtc_probability": 0.3,
              "dry_multiplier": 0.8, "repeat_penalty": 1.3, "presence_penalty": 0.4, "frequency_penalty": 0.2,
              "temperature": 0.7}
    apply_sampler_order(params, ["top_k", "min_p", "temperature"])
    assert params == {"top_k": 7, "top_p": 1.0, "min_p": 0.2, "typical_p": 1.0, "xtc_probability": 0.0,
                      "dry_multiplier": 0.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
                      "frequency_penalty": 0.0, "temperature": 0.7}
    SamplerParams(**params)  # still a valid parameter set

    no_temp = {"temperature": 0.7}
    apply_sampler_order(no_temp, ["top_k"])
    assert no_temp["temperature"] == 1.0


def test_a_reordered_chain_is_refused():
    with pytest.raises(ApiError, match="fixed order"):
        apply_sampler_order({}, ["temperature", "top_k"])
