import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlm_course.lm.tokenizer import CHARS, CharTokenizer

TOK = CharTokenizer()


@given(st.text(alphabet=CHARS, max_size=40))
def test_round_trip(text):
    assert TOK.decode(TOK.encode(text, bos=True, eos=True)) == text


def test_specials_and_vocab():
    assert (TOK.pad_id, TOK.bos_id, TOK.eos_id) == (0, 1, 2)
    assert TOK.vocab_size == 3 + len(CHARS)
    assert TOK.encode("12", eos=True) == [TOK.stoi["1"], TOK.stoi["2"], 2]
    assert TOK.decode([5, 2, 6]) == TOK.itos[5]  # stops at <eos>


def test_unknown_character_raises_clear_error():
    with pytest.raises(ValueError, match=r"\['x'\].*not in the vocabulary"):
        TOK.encode("12x")


def test_left_padded_batch():
    tokens, mask = TOK.encode_prompts(["1+1=", "10+10="])
    assert tokens.shape == (2, 7)
    assert mask[0].tolist() == [False, False] + [True] * 5
    assert tokens[0, :2].tolist() == [0, 0] and tokens[0, 2].item() == TOK.bos_id


def test_a_special_token_inside_a_response_stays_visible_to_the_verifier():
    from rlm_course.tasks import get_task
    from rlm_course.tasks.base import Problem

    four, two = TOK.stoi["4"], TOK.stoi["2"]
    response = [four, TOK.pad_id, two, TOK.eos_id, TOK.pad_id, TOK.pad_id]
    assert TOK.decode(response) == "42"  # display decoding drops specials
    assert TOK.decode_response(response) == "4<pad>2"
    assert TOK.decode_response([TOK.bos_id, four, two]) == "<bos>42"
    assert TOK.decode_response([four, two, TOK.eos_id, TOK.pad_id]) == "42"  # padding after <eos>
    verdict = get_task("addition").verify(Problem("20+22=", "42"), TOK.decode_response(response))
    assert not verdict.format_ok and not verdict.correct


def test_an_empty_batch_of_prompts_is_refused_by_name():
    with pytest.raises(ValueError, match="no prompts"):
        TOK.encode_prompts([])


def test_decoding_refuses_ids_it_would_misread():
    import numpy as np

    tok = CharTokenizer()
    ids = tok.encode("12+3=", bos=True)
    assert tok.decode(np.array(ids)) == tok.decode(torch.tensor(ids)) == "12+3="
    # a negative id wrapped to the vocabulary's last character ("1 " for [4, -1])
    with pytest.raises(ValueError, match="decode_response: id -1 is not a token of this "
                                         r"tokenizer \(ids 0..23\)"):
        tok.decode_response([4, -1])
    with pytest.raises(ValueError, match=r"decode: ids of shape \(2, 6\); decode one row at a "
                                         "time"):
        tok.decode(torch.tensor([ids, ids]))
    with pytest.raises(ValueError, match="decode: id 99"):
        tok.decode([99])
