"""cut_at_stop on a real tokenizer: the kept tokens decode to exactly the text returned, which ends before the stop."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from teamrl.team.stop_strings import cut_at_stop


def test_cut_at_a_token_boundary_and_inside_a_token(tokenizer):
    dec = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    ids = tokenizer.encode("To add 2 and 3\nObservation: 5", add_special_tokens=False)
    k, text = cut_at_stop(dec, ids, [" "])
    assert text == "To" and dec(ids[:k]) == "To"
    k, text = cut_at_stop(dec, ids, ["\nObservation:", "zzz"])
    assert text == "To add 2 and 3" and dec(ids[:k]) == text
    k, text = cut_at_stop(dec, ids, ["dd"])  # starts inside the token " add": that token is not returned
    assert text == "To" and k == 1
    assert cut_at_stop(dec, ids, ["Question:"]) is None


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="ab \n", min_size=1, max_size=30), st.text(alphabet="ab \n", min_size=1, max_size=3))
def test_the_kept_tokens_are_the_returned_text_and_it_holds_no_stop(tokenizer, reply, stop):
    dec = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    ids = tokenizer.encode(reply, add_special_tokens=False)
    cut = cut_at_stop(dec, ids, [stop])
    if cut is None:
        assert stop not in dec(ids)
    else:
        k, text = cut
        assert dec(ids[:k]) == text and stop not in text and dec(ids).startswith(text)
        assert len(text) <= dec(ids).find(stop)
