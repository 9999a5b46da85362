from kvgate.engine.tokenizer import PIECE_CHARS, VOCAB_SIZE, count_tokens, tokenize

ENGLISH = (
    "The quick brown fox jumps over the lazy dog. Paged attention stores the key and "
    "value cache in fixed-size blocks, so that sequences sharing a prefix can share memory; "
    "continuous batching then schedules prefill and decode work in the same step."
)


def test_same_text_same_ids() -> None:
    assert tokenize(ENGLISH) == tokenize(ENGLISH)


def test_ids_are_in_the_vocabulary() -> None:
    assert all(0 <= t < VOCAB_SIZE for t in tokenize(ENGLISH))


def test_about_four_characters_a_token_on_english() -> None:
    chars_per_token = len(ENGLISH) / len(tokenize(ENGLISH))
    assert 3.0 <= chars_per_token <= 5.5


def test_long_words_are_split_into_pieces() -> None:
    word = "x" * (PIECE_CHARS * 3 + 1)
    assert len(tokenize(word)) == 4


def test_leading_space_changes_the_id() -> None:
    assert tokenize("a the")[1] != tokenize("the")[0]


def test_a_shared_prefix_gives_shared_leading_ids() -> None:
    a = tokenize(ENGLISH + " First question?")
    b = tokenize(ENGLISH + " Second question!")
    base = tokenize(ENGLISH)
    assert a[: len(base)] == b[: len(base)] == base
    assert a != b


def test_count_tokens_matches_tokenize() -> None:
    for text in (ENGLISH, "", "   ", "a,b;;c\n\nd", "supercalifragilistic"):
        assert count_tokens(text) == len(tokenize(text))
