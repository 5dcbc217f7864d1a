"""``-hf <user>/<model>[:quant]`` picks the file upstream's downloader picks, from the names alone:
the default quant and its fallbacks, the quant matched case-insensitively, split GGUFs by their
first part with every part, ``-hff`` overriding, the projector that goes with the model, a model
directory fetched whole, and errors that list what the repository has."""

from __future__ import annotations

import pytest

from mlxcel.engine.errors import ModelLoadError
from mlxcel.engine.model.hub_select import choose_files, split_name, split_repo_tag

REPO = "acme/tiny-GGUF"
QUANTS = ["tiny-F16.gguf", "tiny-Q8_0.gguf", "tiny-Q4_K_M.gguf", "tiny-IQ4_XS.gguf", "mmproj-tiny-F16.gguf",
          "mmproj-tiny-Q8_0.gguf", "tiny.imatrix.gguf", "README.md"]


def test_no_quant_is_q4_k_m_then_q8_0_then_the_first_model_file():
    assert choose_files(REPO, QUANTS).primary == "tiny-Q4_K_M.gguf"
    without_q4 = [f for f in QUANTS if "Q4_K_M" not in f]
    assert choose_files(REPO, without_q4).primary == "tiny-Q8_0.gguf"
    neither = [f for f in without_q4 if "Q8_0" not in f or "mmproj" in f]
    # sorted: tiny-F16 before tiny-IQ4_XS; never a projector or an imatrix
    assert choose_files(REPO, neither).primary == "tiny-F16.gguf"


def test_the_quant_matches_case_insensitively_and_only_as_a_whole_tag():
    choice = choose_files(f"{REPO}:q8_0", QUANTS)
    assert choice.primary == "tiny-Q8_0.gguf" and choice.files == ("tiny-Q8_0.gguf",)
    assert choose_files(f"{REPO}:iq4_xs", QUANTS).primary == "tiny-IQ4_XS.gguf"
    with pytest.raises(ModelLoadError):  # Q4_K is not Q4_K_M: the tag must end at "." or "-"
        choose_files(f"{REPO}:Q4_K", QUANTS)


def test_a_missing_quant_lists_what_the_repository_has():
    with pytest.raises(ModelLoadError) as err:
        choose_files(f"{REPO}:Q5_K_S", QUANTS)
    message = str(err.value)
    assert "no GGUF file for quant 'Q5_K_S'" in message
    assert "quants F16, IQ4_XS, Q4_K_M, Q8_0" in message
    assert "tiny-Q4_K_M.gguf" in message and "mmproj" not in message


def test_split_files_are_chosen_by_their_first_part_and_fetched_whole():
    files = [f"big-Q4_K_M-0000{i}-of-00003.gguf" for i in (3, 1, 2)] + ["big-Q8_0.gguf"]
    choice = choose_files(REPO, files)
    assert choice.primary == "big-Q4_K_M-00001-of-00003.gguf"
    assert choice.files == tuple(f"big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3))
    assert split_name(choice.primary).count == 3 and split_name(choice.primary).tag == "Q4_K_M"
    with pytest.raises(ModelLoadError, match=r"split in 3 parts, and part\(s\) 2 are missing"):
        choose_files(REPO, [f for f in files if "00002" not in f])
    # a later part alone is never the model
    assert choose_files(REPO, ["big-Q4_K_M-00002-of-00003.gguf", "small-Q8_0.gguf"]).primary == "small-Q8_0.gguf"


def test_hf_file_overrides_the_quant_and_must_exist():
    assert choose_files(f"{REPO}:Q8_0", QUANTS, "tiny-F16.gguf").primary == "tiny-F16.gguf"
    with pytest.raises(ModelLoadError, match="has no file 'nope.gguf'"):
        choose_files(REPO, QUANTS, "nope.gguf")


def test_the_projector_nearest_the_model_is_recorded():
    assert choose_files(f"{REPO}:Q8_0", QUANTS).mmproj == "mmproj-tiny-Q8_0.gguf"
    assert choose_files(f"{REPO}:F16", QUANTS).mmproj == "mmproj-tiny-F16.gguf"
    assert choose_files(REPO, QUANTS).mmproj == "mmproj-tiny-Q8_0.gguf"  # 4 bits: 8 is nearer than 16
    nested = ["sub/m-Q8_0.gguf", "mmproj-F16.gguf", "sub/mmproj-F16.gguf", "other/mmproj-Q8_0.gguf"]
    assert choose_files(REPO, nested).mmproj == "sub/mmproj-F16.gguf"  # deepest shared folder wins
    assert choose_files(REPO, ["x/m-Q8_0.gguf", "y/mmproj-Q8_0.gguf"]).mmproj is None
    assert "mmproj-tiny-Q8_0.gguf" not in choose_files(f"{REPO}:Q8_0", QUANTS).files  # recorded, not fetched


def test_a_repository_without_gguf_files_is_a_model_directory():
    files = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md",
             ".gitattributes", "chat_template.jinja"]
    choice = choose_files("mlx-community/tiny", files)
    assert choice.primary is None and "README.md" not in choice.files
    assert set(choice.files) == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                 "chat_template.jinja"}
    with pytest.raises(ModelLoadError, match="drop the :quant"):
        choose_files("mlx-community/tiny:Q4_K_M", files)
    with pytest.raises(ModelLoadError, match="not a model repository"):
        choose_files("acme/docs", ["README.md"])


@pytest.mark.parametrize("bad", ["tiny", "a/b/c", "/b", "a/", ""])
def test_a_malformed_repository_is_refused(bad):
    with pytest.raises(ModelLoadError, match=r"expected <user>/<model>\[:quant\]"):
        split_repo_tag(bad)


def test_repo_and_tag_split_as_upstream():
    assert split_repo_tag("acme/x") == ("acme/x", "")
    assert split_repo_tag("acme/x:Q4_K_M") == ("acme/x", "Q4_K_M")
    with pytest.raises(ModelLoadError):  # a regex character in the tag is matched literally
        choose_files("acme/x:Q4.K_M", ["x-Q4_K_M.gguf"])


def test_the_command_line_refuses_a_malformed_repository_before_loading():
    from mlxcel.server.cli.args import parse_args
    from mlxcel.server.runtime.config import ArgumentError

    assert parse_args(["-hf", "acme/x:q8_0", "-hfd", "acme/y"], environ={}).hf_repo == "acme/x:q8_0"
    for argv in (["-hf", "tiny-model"], ["-hfd", "a/b/c"]):
        with pytest.raises(ArgumentError, match=r"expected <user>/<model>\[:quant\]"):
            parse_args(argv, environ={})
