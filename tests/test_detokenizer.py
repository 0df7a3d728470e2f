"""Streaming text: no partial UTF-8 character and no prefix of a stop string is ever released,
and the released pieces join to exactly the final text."""
from __future__ import annotations

import pytest

from qwen_serve.conformance.qwen_tokenizer import build_qwen_tokenizer
from qwen_serve.engine.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tok():
    return build_qwen_tokenizer()


def stream(tok, text, stop=()):
    ids = tok.encode(text).ids
    detok = IncrementalDetokenizer(tok.decode, stop)
    pieces = []
    for token in ids:
        detok.add(token)
        pieces.append(detok.release())
        if detok.stopped_by:
            break
    pieces.append(detok.release(final=True))
    return detok, pieces


@pytest.mark.parametrize("text", ["héllo wörld 你好世界 🙂👍 🦩𠜎 done", "plain ascii text", "日本語のテキスト" * 3])
def test_pieces_join_to_decoded_text_without_broken_characters(tok, text):
    detok, pieces = stream(tok, text)
    assert "".join(pieces) == text == detok.text
    assert all("\ufffd" not in p for p in pieces)


def test_character_split_across_tokens_is_held_back(tok):
    rare = [c for c in "🦩𠜎𝔘🜁" if len(tok.encode(c).ids) > 1]
    assert rare, "expected a character whose bytes span several tokens"
    ids = tok.encode(rare[0]).ids
    detok = IncrementalDetokenizer(tok.decode)
    detok.add(ids[0])
    assert detok.release() == ""


def test_stop_string_across_token_boundaries_is_cut_and_never_leaks(tok):
    text = "The answer is 42. END OF ANSWER and more text"
    detok, pieces = stream(tok, text, stop=["END OF"])
    assert detok.stopped_by == "END OF"
    assert "".join(pieces) == "The answer is 42. "
    for i in range(len(pieces)):
        assert "E" not in "".join(pieces[: i + 1])[len("The answer is 42. "):]


def test_earliest_stop_string_wins(tok):
    detok, pieces = stream(tok, "alpha beta gamma delta", stop=["gamma", "beta"])
    assert "".join(pieces) == "alpha " and detok.stopped_by == "beta"


def test_partial_stop_prefix_is_released_when_it_does_not_complete(tok):
    detok, pieces = stream(tok, "an END is near", stop=["END OF"])
    assert detok.stopped_by is None
    assert "".join(pieces) == "an END is near"
    # "END" was held back while it could still have become "END OF"
    joined = ""
    for piece in pieces[:-1]:
        joined += piece
        assert not joined.endswith(("END", "END ", "EN"))
