"""Selector: each label's compiled test answers exactly as fnmatchcase does."""

import copy
import pickle
from fnmatch import fnmatchcase

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tailguard.streams.errors import ConfigError
from tailguard.streams.selector import Selector

# Letters, glob syntax and regex metacharacters, so translation mistakes show.
_ALPHABET = "ab*?[]!.\\()|^$+"
patterns = st.lists(st.text(_ALPHABET, min_size=1, max_size=6), min_size=1, max_size=3)
values = st.text("ab.()|^$+\\[]!*?", max_size=6)


@given(patterns, values)
def test_a_label_matches_exactly_when_fnmatchcase_says_so(service, value):
    selector = Selector(service=tuple(service))
    expected = any(fnmatchcase(value, p) for p in service)
    assert selector.matches(value, "m") is expected


def test_every_label_must_match():
    selector = Selector(service=("chat",), model=("llama-*",), variant=("b",), tenant=("t?",))
    assert selector.matches("chat", "llama-70b", "b", "t1")
    assert not selector.matches("chat", "llama-70b", "b", "t10")
    assert not selector.matches("chat", "mistral", "b", "t1")
    assert not selector.matches("chat", "llama-70b", "a", "t1")
    assert not selector.matches("search", "llama-70b", "b", "t1")


def test_the_default_matches_every_series():
    assert Selector().matches("any", "model", "variant", "tenant")


def test_equal_selectors_are_equal_and_survive_copy_and_pickle():
    selector = Selector(service=("chat*", "search"), tenant=("a", "b"))
    assert selector == Selector(service=("chat*", "search"), tenant=("a", "b"))
    assert hash(selector) == hash(Selector(service=("chat*", "search"), tenant=("a", "b")))
    for twin in (copy.deepcopy(selector), pickle.loads(pickle.dumps(selector))):
        assert twin == selector
        assert twin.matches("chatbot", "m", "v", "b")
        assert not twin.matches("chatbot", "m", "v", "c")


@pytest.mark.parametrize("bad", [(), ("",), ["chat"], (1,)])
def test_a_malformed_pattern_list_is_refused(bad):
    with pytest.raises(ConfigError):
        Selector(service=bad)
