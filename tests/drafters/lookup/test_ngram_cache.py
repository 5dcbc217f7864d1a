"""ngram-cache: upstream's drafting rule over its three caches (context with the lax floors, dynamic with
the strict ones, the static cache weighing and drafting alone), the slot's context cache outliving a
request, counting only what a new request adds, and llama.cpp's lookup-cache file format."""

from __future__ import annotations

import struct

import pytest

from mlxcel.drafters.lookup import cache_file
from mlxcel.drafters.lookup.cache_file import CacheFileError
from mlxcel.drafters.lookup.ngram_cache import NgramCacheDrafter, SharedCaches, SlotCounts
from mlxcel.drafters.lookup.ngram_counts import LAX, STRICT, NgramCounts, pick, pick_static
from mlxcel.engine.sampling.params import SamplerParams

GREEDY = SamplerParams(temperature=0.0)


def counts(table: dict) -> NgramCounts:
    return NgramCounts({k: dict(v) for k, v in table.items()})


def test_counting_records_every_1_to_4_gram_before_each_new_token():
    c = NgramCounts()
    c.add([1, 2, 3, 1, 2], 0, 1, 4)
    assert c.get((1, 2)) == {3: 1} and c.get((2,)) == {3: 1} and c.get((1,)) == {2: 2}
    assert c.get((1, 2, 3, 1)) == {2: 1} and c.get((3, 1, 2)) is None  # nothing followed it yet
    c.add([1, 2, 3, 1, 2, 3], 5, 1, 4)  # only the new token's n-grams
    assert c.get((1, 2)) == {3: 2} and c.get((1,)) == {2: 2}


def test_the_floors_per_ngram_length():
    once = counts({(7,): {8: 1}, (6, 7): {8: 1}, (5, 6, 7): {8: 1}})
    assert pick(once, [(7,)], {}, LAX) is None  # a 1-gram needs two observations
    assert pick(once, [(6, 7)], {}, LAX) is None  # so does a 2-gram
    assert pick(once, [(5, 6, 7), (6, 7), (7,)], {}, LAX) == 8  # a 3-gram seen once drafts
    split = counts({(7,): {8: 2, 9: 1}})
    assert pick(split, [(7,)], {}, LAX) == 8  # 2 of 3 >= 66%
    assert pick(split, [(7,)], {}, STRICT) is None  # fewer than 4 observations
    assert pick(counts({(7,): {8: 3, 9: 1}}), [(7,)], {}, STRICT) == 8  # 4 seen, 75%


def test_the_longest_suffix_that_passes_its_floor_drafts():
    c = counts({(4, 5, 6, 7): {1: 1}, (7,): {2: 5}})
    assert pick(c, [(4, 5, 6, 7), (5, 6, 7), (6, 7), (7,)], {}, LAX) == 1


def test_the_static_cache_weighs_candidates_and_drafts_alone():
    c = counts({(5, 6, 7): {8: 2, 9: 2}})
    assert pick(c, [(5, 6, 7)], {}, LAX) == 8  # a tie: the first seen
    assert pick(c, [(5, 6, 7)], {9: 1}, LAX) == 9  # the static cache's candidate outweighs
    assert pick_static({5: 3, 6: 1}) == 5 and pick_static({5: 1}) is None and pick_static({5: 1, 6: 1}) == 5


def started(slot: SlotCounts, seq: list[int], shared: SharedCaches | None = None) -> NgramCacheDrafter:
    drafter = NgramCacheDrafter(slot, shared or SharedCaches())
    drafter.start(seq, GREEDY, 0)
    return drafter


ANSWER = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]


def test_the_slot_context_cache_outlives_its_request():
    slot = SlotCounts()
    first = [1, 2, 3]
    d = started(slot, first)
    assert d.propose(first, 8).tokens == []
    d.propose([*first, *ANSWER], 8)  # the answer the first request generated is counted
    again = [1, 2, 3]  # the same request once more, in the same slot
    d2 = started(slot, again)
    assert d2.propose(again, 8).tokens == ANSWER[:8]  # (1, 2, 3) was followed by 40 once: a 3-gram drafts
    assert started(SlotCounts(), again).propose(again, 8).tokens == []  # another slot has not seen it


def test_a_new_request_counts_only_past_what_it_shares_with_the_last():
    slot = SlotCounts()
    history = [1, 2, 3, *ANSWER]
    started(slot, history)
    assert slot.counts.get((2, 3)) == {40: 1}
    started(slot, [*history, 7, 8])  # the next turn: the history again, then its own tokens
    assert slot.counts.get((2, 3)) == {40: 1} and slot.counts.get((49, 7)) == {8: 1}
    started(slot, [1, 2, 3, 40, 5])  # diverges after four tokens: its own n-grams from there on
    assert slot.counts.get((2, 3)) == {40: 1} and slot.counts.get((3, 40)) == {41: 1, 5: 1}


def test_the_dynamic_cache_drafts_under_the_strict_floors_and_a_block_caps_it():
    dynamic = counts({(1, 2, 3): {4: 2}, (2, 3, 4): {5: 2}, (3, 4, 5): {6: 1}})
    d = started(SlotCounts(), [1, 2, 3], SharedCaches(dynamic=dynamic))
    assert d.propose([1, 2, 3], 8).tokens == [4, 5]  # (3, 4, 5) seen once: below the strict 3-gram floor
    assert d.propose([1, 2, 3], 1).tokens == [4] and d.peek([1, 2, 3]) == 4


def record(ngram, pairs) -> bytes:
    return struct.pack("<5i", *ngram, *[-1] * (4 - len(ngram)), len(pairs)) + b"".join(
        struct.pack("<2i", t, n) for t, n in pairs)


def test_cache_files_are_read_in_llama_cpp_format_and_written_back_the_same(tmp_path):
    path = tmp_path / "static.bin"
    path.write_bytes(record([5, 6], [(7, 3), (8, 1)]) + record([9], [(10, 2)]))
    loaded = cache_file.load(path)
    assert loaded.get((5, 6)) == {7: 3, 8: 1} and loaded.get((9,)) == {10: 2} and len(loaded) == 2
    out = tmp_path / "again.bin"
    cache_file.save(loaded, out)
    assert out.read_bytes() == path.read_bytes()
    # a static cache drafts alone: 7 follows (5, 6) in 3 of 4 observations
    d = started(SlotCounts(), [5, 6], SharedCaches(static=loaded))
    assert d.propose([5, 6], 1).tokens == [7]


@pytest.mark.parametrize("data, needle", [
    (record([5, 6], [(7, 3)])[:-4], "not in llama.cpp's format"),
    (record([5, 6], [(7, 3)]) + b"\0\0", "truncated"),
    (record([5, 6], [(7, 0)]), "count of 0"),
    (record([-1, 6], [(7, 1)]), "an n-gram"),
])
def test_a_bad_cache_file_is_refused_with_a_reason(tmp_path, data, needle):
    path = tmp_path / "bad.bin"
    path.write_bytes(data)
    with pytest.raises(CacheFileError, match=needle):
        cache_file.load(path)
    with pytest.raises(CacheFileError, match="cannot read"):
        cache_file.load(tmp_path / "missing.bin")


def test_a_draft_shorter_than_n_min_is_retracted():
    dynamic = counts({(1, 2, 3): {4: 2}, (2, 3, 4): {5: 2}})
    shared = SharedCaches(dynamic=dynamic)
    assert NgramCacheDrafter(SlotCounts(), shared, n_min=2).propose([1, 2, 3], 8).tokens == [4, 5]
    assert NgramCacheDrafter(SlotCounts(), shared, n_min=3).propose([1, 2, 3], 8).tokens == []
