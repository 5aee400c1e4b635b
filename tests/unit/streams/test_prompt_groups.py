"""Prompt-version grouping: hand-labelled families with the bundled model, stability, bytes.

The corpus below is the one the module docstring's similarity table was
measured on. Each family holds versions of one prompt (small edits and close
rewordings); the others are different prompts, some sharing a family's
template (a bookstore vs an airline support agent, writing SQL vs explaining
it, extracting dates vs names as JSON) — the hardest pairs to keep apart.
"""

import itertools
import random

import numpy as np
import pytest
from tailguard.streams.errors import ConfigError, CorruptStateError
from tailguard.streams.prompt_groups import (
    DEFAULT_THRESHOLD,
    PromptGrouper,
    wordllama_embedder,
)

FAMILIES: dict[str, list[tuple[str, str]]] = {
    "support": [
        (
            "support-v1",
            "You are a friendly customer support agent for an online bookstore. Help customers "
            "track orders, process returns and answer questions about shipping. Be polite and "
            "concise.",
        ),
        (
            "support-v2",
            "You are a friendly customer support agent for an online bookstore. Help customers "
            "track orders, process returns and answer questions about shipping and delivery "
            "times. Be polite and concise, and never promise refunds you cannot give.",
        ),
        (
            "support-v3",
            "You are a polite customer service assistant for an online book shop. Help customers "
            "with order tracking, returns and shipping questions. Keep answers short and friendly.",
        ),
    ],
    "sql": [
        (
            "sql-v1",
            "Translate the user's question into a single SQL query for a PostgreSQL database. Use "
            "only the tables and columns in the schema below. Return only the SQL, without "
            "explanation.",
        ),
        (
            "sql-v2",
            "Convert the user's request into one PostgreSQL SQL query. Only use tables and columns "
            "from the given schema. Output just the query, no explanation.",
        ),
        (
            "sql-v3",
            "Translate the user's question into a single SQL query for a PostgreSQL database. Use "
            "only the tables and columns in the schema below. Prefer explicit JOINs. Return only "
            "the SQL, without explanation or markdown.",
        ),
    ],
    "summary": [
        (
            "summary-v1",
            "Summarize the following news article in three bullet points. Keep each bullet under "
            "twenty words and keep the key facts, names and numbers.",
        ),
        (
            "summary-v2",
            "Write a three-bullet summary of the news article below. Each bullet should be "
            "shorter than twenty words and preserve the important facts, names and figures.",
        ),
        (
            "summary-v3",
            "Summarize the following news article in three bullet points. Keep each bullet under "
            "twenty words and keep the key facts, names and numbers. Do not add opinions.",
        ),
    ],
    "triage": [
        (
            "triage-v1",
            "You are a medical triage assistant. Ask the patient about their symptoms, how long "
            "they have had them and how severe they are, then advise whether to see a doctor "
            "urgently, book an appointment or rest at home. Always tell them to call emergency "
            "services for chest pain or difficulty breathing.",
        ),
        (
            "triage-v2",
            "Act as a triage nurse assistant. Ask about the patient's symptoms, their duration and "
            "severity, and recommend urgent care, a regular appointment or home care. For chest "
            "pain or trouble breathing always tell them to call emergency services.",
        ),
        (
            "triage-v3",
            "You are a medical triage assistant. Ask the patient about their symptoms, how long "
            "they have had them and how severe they are, then advise whether to see a doctor "
            "urgently, book an appointment or rest at home. Always tell them to call emergency "
            "services for chest pain, difficulty breathing or sudden weakness. Do not give a "
            "diagnosis.",
        ),
    ],
    "review": [
        (
            "review-v1",
            "You are a senior Python engineer reviewing a pull request. Point out bugs, security "
            "problems and unclear names, and suggest concrete fixes with code. Be direct but "
            "respectful.",
        ),
        (
            "review-v2",
            "You are a senior Python engineer reviewing a pull request. Point out bugs, security "
            "problems, missing tests and unclear names, and suggest concrete fixes with code. Be "
            "direct but respectful.",
        ),
    ],
    "french": [
        (
            "french-v1",
            "Translate the following English text into French. Keep the tone and formatting of "
            "the original, and do not translate product names.",
        ),
        (
            "french-v2",
            "Translate the text below from English to French, preserving its tone and "
            "formatting. Leave product names untranslated.",
        ),
        (
            "french-v3",
            "Translate the following English text into French. Keep the tone and formatting of "
            "the original, do not translate product names, and use the formal 'vous'.",
        ),
    ],
}

OTHERS: list[tuple[str, str]] = [
    (
        "airline-v1",
        "You are a friendly customer support agent for an airline. Help passengers change "
        "flights, request refunds and answer questions about baggage. Be polite and concise.",
    ),
    ("sql-explain-v1", "Explain what the following SQL query does in plain English, step by step."),
    (
        "invoice-v1",
        "Extract all dates, amounts and invoice numbers from the document below and return them "
        "as JSON.",
    ),
    (
        "entities-v1",
        "Extract all person names, companies and locations from the text below and return them "
        "as JSON.",
    ),
    (
        "contract-v1",
        "Summarize the following legal contract, listing the obligations of each party and any "
        "termination clauses.",
    ),
    ("poem-v1", "Write a short poem about autumn leaves falling in a quiet park."),
    (
        "tutor-v1",
        "You are a math tutor. Explain step by step how to solve the quadratic equation the "
        "student gives you, without giving the final answer directly.",
    ),
    (
        "sentiment-v1",
        "Classify the sentiment of the product review as positive, negative or neutral. Answer "
        "with one word.",
    ),
    (
        "topic-v1",
        "Classify the topic of the news headline as politics, sports, business or technology. "
        "Answer with one word.",
    ),
    (
        "tests-v1",
        "You are a senior Python engineer. Write unit tests with pytest for the function the user "
        "gives you, covering edge cases.",
    ),
    (
        "travel-v1",
        "You are a travel planner. Build a three-day itinerary for the city the user names, with "
        "restaurants, museums and walking routes.",
    ),
    (
        "bank-v1",
        "You are a helpful assistant for a bank. Answer questions about accounts, cards and "
        "transfers. Never ask for passwords or full card numbers.",
    ),
    (
        "hospital-v1",
        "You are a helpful assistant for a hospital. Answer questions about appointments, "
        "visiting hours and parking. Never give medical advice.",
    ),
    ("pirate-v1", "You are a pirate. Answer every question in pirate speak."),
]

CORPUS: list[tuple[str, str]] = [v for fam in FAMILIES.values() for v in fam] + OTHERS

#: The hand-labelled expectation: each family is one group, every other prompt its own.
EXPECTED: set[frozenset[str]] = {frozenset(v for v, _ in fam) for fam in FAMILIES.values()} | {
    frozenset({v}) for v, _ in OTHERS
}


@pytest.fixture(scope="module")
def embed():  # type: ignore[no-untyped-def]
    return wordllama_embedder()


def _partition(grouper: PromptGrouper) -> set[frozenset[str]]:
    return {frozenset(members) for members in grouper.groups().values()}


def _grouped(embed, items, threshold=DEFAULT_THRESHOLD):  # type: ignore[no-untyped-def]
    grouper = PromptGrouper(threshold, embed)
    for version, text in items:
        grouper.add(version, text)
    return grouper


# -- the bundled model, hand-labelled ---------------------------------------


def test_bundled_model_groups_the_corpus_as_labelled(embed) -> None:  # type: ignore[no-untyped-def]
    grouper = _grouped(embed, CORPUS)
    assert _partition(grouper) == EXPECTED
    assert grouper.group_of("sql-v3") == "pg-sql-v1"
    assert grouper.group_of("poem-v1") == "pg-poem-v1"
    assert grouper.groups()["pg-triage-v1"] == ["triage-v1", "triage-v2", "triage-v3"]


def test_default_threshold_separates_families_from_other_prompts(embed) -> None:  # type: ignore[no-untyped-def]
    """The measurement behind DEFAULT_THRESHOLD: every pair within a family lies above it,
    every pair of different prompts below it, each with a margin."""
    label = {v: name for name, fam in FAMILIES.items() for v, _ in fam}
    label |= {v: v for v, _ in OTHERS}
    rows = embed([t for _, t in CORPUS])
    sims = rows @ rows.T
    within, across = [], []
    for i, j in itertools.combinations(range(len(CORPUS)), 2):
        same = label[CORPUS[i][0]] == label[CORPUS[j][0]]
        (within if same else across).append(float(sims[i, j]))
    assert min(within) >= DEFAULT_THRESHOLD + 0.02
    assert max(across) <= DEFAULT_THRESHOLD - 0.1
    assert float(np.median(across)) < 0.2  # this model's scale: unrelated prompts sit near 0


def test_a_heavy_rewording_founds_its_own_group(embed) -> None:  # type: ignore[no-untyped-def]
    rewrite = (
        "review-v3",
        "Review this Python pull request as an experienced engineer: identify bugs, security "
        "issues and poor naming, and propose specific code changes. Be blunt yet kind.",
    )
    grouper = _grouped(embed, [*FAMILIES["review"], rewrite])
    assert grouper.group_of("review-v3") == "pg-review-v3"
    # ... which a looser threshold (the article's 0.62 on this model) would merge.
    assert _grouped(embed, [*FAMILIES["review"], rewrite], 0.62).group_of("review-v3") == (
        "pg-review-v1"
    )


def test_a_one_word_change_of_meaning_looks_like_an_edit(embed) -> None:  # type: ignore[no-untyped-def]
    """The documented limit of a bag-of-words model: French → German stays in the group."""
    german = FAMILIES["french"][0][1].replace("French", "German")
    grouper = _grouped(embed, [FAMILIES["french"][0], ("german-v1", german)])
    assert grouper.group_of("german-v1") == "pg-french-v1"


def test_order_of_adding_does_not_change_the_partition(embed) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(7)
    baseline = _partition(_grouped(embed, CORPUS))
    for _ in range(5):
        shuffled = CORPUS[:]
        rng.shuffle(shuffled)
        grouper = _grouped(embed, shuffled)
        assert _partition(grouper) == baseline
        for gid, members in grouper.groups().items():
            assert gid == "pg-" + members[0]  # ids follow the founder, i.e. the order


def test_adding_versions_never_moves_existing_ones(embed) -> None:  # type: ignore[no-untyped-def]
    grouper = PromptGrouper(embed=embed)
    seen: dict[str, str] = {}
    for version, text in CORPUS:
        grouper.add(version, text)
        seen[version] = grouper.group_of(version)  # type: ignore[assignment]
        assert {v: grouper.group_of(v) for v in seen} == seen


def test_embeddings_are_deterministic(embed) -> None:  # type: ignore[no-untyped-def]
    texts = [t for _, t in CORPUS[:5]]
    assert np.array_equal(embed(texts), embed(list(reversed(texts)))[::-1])


def test_bundled_model_loads_without_network_and_embeds_fast(embed) -> None:  # type: ignore[no-untyped-def]
    assert embed.model_id == "wordllama/l2_supercat_256"
    rows = embed(["a"] * 3)
    assert rows.shape == (3, 256)


# -- the rule, with a toy embedding -------------------------------------------


def _toy(texts):  # type: ignore[no-untyped-def]
    """Each text is 'x,y': a 2-D vector, so similarities are set by hand."""
    return np.array([[float(p) for p in t.split(",")] for t in texts], dtype=np.float32)


def test_a_version_joins_the_most_similar_group_at_or_above_threshold() -> None:
    g = PromptGrouper(0.9, _toy)
    assert g.add("a", "1,0") == "pg-a"
    assert g.add("b", "0,1") == "pg-b"
    assert g.add("c", "1,0.2") == "pg-a"  # cos ≈ 0.98
    assert g.add("d", "1,1") == "pg-d"  # cos 0.707 to both: below
    assert g.add("e", "0.1,1") == "pg-b"  # nearer b (0.995) than d (0.77)
    assert g.groups() == {"pg-a": ["a", "c"], "pg-b": ["b", "e"], "pg-d": ["d"]}


def test_the_founder_is_the_fixed_representative_so_groups_do_not_drift() -> None:
    g = PromptGrouper(0.95, _toy)
    g.add("v1", "1,0")
    g.add("v2", "1,0.3")  # cos 0.958 to v1: joins
    assert g.add("v3", "1,0.6") == "pg-v3"  # 0.99 to v2 but 0.857 to the founder v1
    assert g.group_of("v2") == "pg-v1"


def test_a_known_version_keeps_its_group() -> None:
    g = PromptGrouper(0.9, _toy)
    g.add("a", "1,0")
    assert g.add("a", "0,1") == "pg-a"
    assert g.groups() == {"pg-a": ["a"]}


def test_hash_only_versions_join_their_parents_group_or_their_own() -> None:
    g = PromptGrouper(0.9, _toy)
    g.add("base", "1,0")
    assert g.add("secret", None, parent="base") == "pg-base"
    assert g.add("orphan", None, parent="unknown") == "pg-orphan"
    assert g.add("orphan-child", None, parent="orphan") == "pg-orphan"
    # a hash-only group has no text: no text version can join it
    assert g.add("text", "1,0.01") == "pg-base"
    assert g.group_of("never") is None


def test_group_ids_do_not_collide_with_a_version_named_like_a_group() -> None:
    g = PromptGrouper(0.9, _toy)
    g.add("x", "1,0")
    assert g.add("pg-x", None) == "pg-pg-x"
    assert g.add("y", None, parent="x") == "pg-x"


def test_threshold_outside_cosine_range_is_refused() -> None:
    for bad in (1.5, -2.0, float("nan")):
        with pytest.raises(ConfigError, match="cosine similarity"):
            PromptGrouper(bad, _toy)


def test_persistence_round_trip_keeps_groups_and_future_assignments() -> None:
    g = PromptGrouper(0.9, _toy)
    for version, text in [("a", "1,0"), ("b", "0,1"), ("c", "1,0.1"), ("h", None)]:
        g.add(version, text, parent="a" if text is None else None)
    restored = PromptGrouper.from_bytes(g.to_bytes(), _toy)
    assert restored.groups() == g.groups()
    assert restored.threshold == 0.9
    assert restored.parent_of("h") == "a"
    assert restored.to_bytes() == g.to_bytes()
    # the restored one assigns new versions exactly as the original does
    for version, text in [("d", "0.1,1"), ("e", "1,1")]:
        assert restored.add(version, text) == g.add(version, text)


def test_persistence_round_trip_with_the_bundled_model(embed) -> None:  # type: ignore[no-untyped-def]
    g = _grouped(embed, CORPUS[:10])
    restored = PromptGrouper.from_bytes(g.to_bytes(), embed)
    assert restored.groups() == g.groups()
    for version, text in CORPUS[10:]:
        assert restored.add(version, text) == g.add(version, text)


def test_bytes_of_another_model_or_garbage_are_refused(embed) -> None:  # type: ignore[no-untyped-def]
    data = _grouped(embed, CORPUS[:3]).to_bytes()
    with pytest.raises(ConfigError, match="not comparable"):
        PromptGrouper.from_bytes(data, _toy)
    with pytest.raises(CorruptStateError):
        PromptGrouper.from_bytes(b"\x93garbage", _toy)
