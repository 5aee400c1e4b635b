"""Prompt-version grouping: near-identical prompt versions share one group.

LLM releases are mostly prompt changes, and prompt versions multiply faster
than experiments can measure them (the article, §4.2): one version rarely
gathers enough traffic to be judged alone. Versions whose texts say nearly
the same thing are put in one *group*, and SLIs are kept per group
(:mod:`tailguard.streams.prompt_sli`).

The rule (stable online clustering)
-----------------------------------
Versions are added one at a time, in registry order (the offset order of the
compacted topic ``tailguard.prompts``), and each gets its group once::

    e = embed(text) / ‖embed(text)‖                      (unit vector)
    s_g = e · r_g   for every group g founded by a text    (cosine similarity)
    g* = argmax s_g  (ties: the oldest group)
    s_g* ≥ threshold  →  the version joins g*
    otherwise          →  it founds group "pg-" + version, and r_new = e

``r_g`` is the embedding of the group's *founder* (its first member) and
never changes, so adding a version never moves an existing one, and a group
does not drift: a chain of small edits v1 → v2 → … stays in v1's group only
while each version is still within ``threshold`` of v1 itself. Group ids are
deterministic (``"pg-"`` + the founder's version), so every worker that
reads the registry in the same order computes the same groups — embeddings
are deterministic (a table lookup and a mean, no sampling). For families
that are well separated (every pair within a family ≥ threshold, every pair
across < threshold) the partition does not depend on the order of adding;
only the group *ids* (the founder) do.

- A version already known keeps its group (a version is immutable; a
  re-published text is ignored).
- A *hash-only* version (the registry holds its ``text_sha256``, not its
  text) cannot be compared: it joins its parent's group when the parent is
  known, else it founds a group that no text can join (no representative).

What the article's 0.62 means, and why this threshold differs
-------------------------------------------------------------
The article (§4.2, "Prompt版本爆炸管理") embeds prompts with an unnamed
"diffusion-fine-tuned" 768-dimensional model, L2-normalises the vectors and
compares them by cosine similarity; 0.62 is its "validated semantic
differentiation threshold" for those vectors (its gray-release groups have
mean pairwise similarity 0.58–0.59). It is a point on *that model's*
similarity scale and does not carry over: every embedding model spreads
texts differently (a static word-vector average such as the one used here
puts unrelated English prompts near 0.06, a transformer encoder often near
0.3–0.5). Read in the direction this module needs — versions whose
similarity is at or above the threshold are "the same prompt" — the
threshold has to be measured again for the model in use.

The model: `wordllama <https://github.com/dleemiller/WordLlama>`_ (MIT), whose
PyPI wheel carries its default weights (``l2_supercat`` 256-d token
embeddings distilled from Llama-2's, 16 MB) and tokenizer: ~19 MB wheel,
loads in ~0.3 s (0.6 s import), ~10,000 short prompts/s and ~500 prompts of
400 words/s on one core, no network. Its loader would fetch the tokenizer
from Hugging Face (it looks for the shipped file in the wrong folder), so
:func:`wordllama_embedder` opens the shipped files itself.

Measured with it (cosine similarity; the corpus of
``tests/unit/streams/test_prompt_groups.py``: 6 families of 2–3 versions and
14 other prompts, 16 pairs within families and 449 across, plus 7 heavier
rewordings tried apart):

==================================================  ===================
pair                                                similarity
==================================================  ===================
small edit of a version (a sentence added/changed)  0.87 – 0.97
close rewording (the families' other members)       0.77 – 0.87
heavy rewording of the same instructions            0.56 – 0.72
same template, other task or domain                 0.22 – 0.61
unrelated prompts                                   −0.16 – 0.30
                                                    (median 0.06)
==================================================  ===================

Heavy rewordings and same-template prompts overlap (0.56 vs 0.61), so no
threshold separates them with this model. The default, **0.75**, is chosen
so that a group never mixes different prompts: it is 0.14 above the most
similar pair of different prompts measured (0.61, "extract dates … as JSON"
vs "extract names … as JSON") and below every pair within a family (≥ 0.77;
small edits ≥ 0.87). A heavy rewording founds its own group; that only
delays judging it, while a wrong merge would blame one prompt for another's
requests. The article's 0.62 on this model would merge most heavy
rewordings and sit right at the same-template pairs.

Known limit of a bag-of-words model: a one-word change that changes the
meaning ("into French" → "into German", 0.92) looks like an edit; give such a
version a different text or judge it by version.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec
import numpy as np
from tailguard.streams.errors import ConfigError, CorruptStateError

__all__ = [
    "DEFAULT_THRESHOLD",
    "GROUP_PREFIX",
    "EmbedFn",
    "PromptGrouper",
    "WordLlamaEmbedder",
    "wordllama_embedder",
]

#: Cosine similarity to a group's founder at or above which a version joins it
#: (for :func:`wordllama_embedder`; see the module docstring).
DEFAULT_THRESHOLD: Final = 0.75
#: Group ids are this prefix + the founder's version.
GROUP_PREFIX: Final = "pg-"

#: texts → one embedding row per text (any scale; rows are normalised here).
EmbedFn = Callable[[Sequence[str]], np.ndarray]


class _Group(msgspec.Struct, array_like=True):
    gid: str
    #: The founder's unit embedding (float32 bytes); None for a hash-only founder.
    rep: bytes | None
    members: list[str]


class _Wire(msgspec.Struct, array_like=True):
    v: int
    threshold: float
    model: str
    groups: list[_Group]
    #: (version, group id, parent) in the order the versions were added.
    versions: list[tuple[str, str, str | None]]


_WIRE_VERSION: Final = 1
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Wire)


class PromptGrouper:
    """Groups prompt versions by the cosine similarity of their embeddings (see module doc).

    ``embed`` maps texts to one row each; by default the bundled wordllama
    model (loaded on first use). Not thread-safe: one owner calls it.
    """

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, embed: EmbedFn | None = None) -> None:
        if not -1.0 <= threshold <= 1.0:  # also refuses NaN
            msg = f"prompt group threshold is a cosine similarity in [-1, 1], got {threshold!r}"
            raise ConfigError(msg)
        self.threshold = float(threshold)
        self._embed = embed
        self._group_of: dict[str, str] = {}
        self._parent: dict[str, str | None] = {}
        self._members: dict[str, list[str]] = {}
        #: Groups founded by a text, in creation order, and their founders' rows.
        self._rep_ids: list[str] = []
        self._reps = np.zeros((0, 0), dtype=np.float32)

    # -- queries ----------------------------------------------------------

    def group_of(self, version: str) -> str | None:
        """The group of ``version``; None when it was never added."""
        return self._group_of.get(version)

    def groups(self) -> dict[str, list[str]]:
        """Group id → its versions in the order they were added (groups oldest first)."""
        return {gid: list(members) for gid, members in self._members.items()}

    def members(self, group: str) -> list[str]:
        """The versions of ``group`` (empty when unknown)."""
        return list(self._members.get(group, ()))

    def parent_of(self, version: str) -> str | None:
        return self._parent.get(version)

    def __len__(self) -> int:
        return len(self._group_of)

    def __contains__(self, version: object) -> bool:
        return version in self._group_of

    @property
    def model_id(self) -> str:
        return str(getattr(self._embed, "model_id", "custom")) if self._embed else _MODEL_ID

    # -- adding -----------------------------------------------------------

    def add(self, version: str, text: str | None, parent: str | None = None) -> str:
        """Assign ``version`` (its ``text``, or None when only a hash is known) a group.

        Returns the group id. A version already added keeps its group.
        """
        if not version:
            msg = "a prompt version is a non-empty string"
            raise ConfigError(msg)
        known = self._group_of.get(version)
        if known is not None:
            return known
        if text is None or not text.strip():
            parent_group = self._group_of.get(parent) if parent else None
            gid = parent_group or self._found(version, None)
        else:
            row = self._unit(text)
            gid = self._nearest(row) or self._found(version, row)
        self._group_of[version] = gid
        self._parent[version] = parent
        self._members.setdefault(gid, []).append(version)
        return gid

    def warm(self) -> None:
        """Load the model now (the default one loads on first use, ~1 s)."""
        if self._embed is None:
            self._embed = wordllama_embedder()

    def similarity(self, a: str, b: str) -> float:
        """Cosine similarity of two texts under this grouper's model."""
        rows = self._embed_rows([a, b])
        return float(rows[0] @ rows[1])

    def _embed_rows(self, texts: Sequence[str]) -> np.ndarray:
        if self._embed is None:
            self._embed = wordllama_embedder()
        rows = np.asarray(self._embed(list(texts)), dtype=np.float32)
        if rows.ndim != 2 or rows.shape[0] != len(texts):
            msg = f"embed returned shape {rows.shape} for {len(texts)} texts"
            raise ConfigError(msg)
        norms = np.linalg.norm(rows, axis=1, keepdims=True)
        return np.asarray(rows / np.where(norms > 0, norms, 1.0), dtype=np.float32)

    def _unit(self, text: str) -> np.ndarray:
        row: np.ndarray = self._embed_rows([text])[0]
        return row

    def _nearest(self, row: np.ndarray) -> str | None:
        if not self._rep_ids:
            return None
        if self._reps.shape[1] != row.shape[0]:
            msg = (
                f"embedding has {row.shape[0]} dimensions, the groups' have "
                f"{self._reps.shape[1]}: a grouper keeps one model"
            )
            raise ConfigError(msg)
        sims = self._reps @ row
        best = int(np.argmax(sims))  # the first maximum: the oldest group on a tie
        return self._rep_ids[best] if float(sims[best]) >= self.threshold else None

    def _found(self, version: str, row: np.ndarray | None) -> str:
        gid = GROUP_PREFIX + version
        while gid in self._members:  # a version named like another's group id
            gid += "~"
        self._members[gid] = []
        if row is not None:
            self._rep_ids.append(gid)
            reps = row[np.newaxis, :]
            self._reps = reps if not self._reps.size else np.vstack([self._reps, reps])
        return gid

    # -- bytes ------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The whole grouping (founders' embeddings included): msgpack, versioned."""
        rep_of = {gid: self._reps[i].astype("<f4").tobytes() for i, gid in enumerate(self._rep_ids)}
        wire = _Wire(
            v=_WIRE_VERSION,
            threshold=self.threshold,
            model=self.model_id,
            groups=[_Group(gid, rep_of.get(gid), list(m)) for gid, m in self._members.items()],
            versions=[(v, g, self._parent.get(v)) for v, g in self._group_of.items()],
        )
        return _encoder.encode(wire)

    @classmethod
    def from_bytes(cls, data: bytes, embed: EmbedFn | None = None) -> PromptGrouper:
        """Inverse of :meth:`to_bytes`. ``embed`` must be the model the bytes were made with."""
        try:
            wire = _decoder.decode(data)
        except msgspec.DecodeError as exc:
            msg = f"prompt grouping bytes do not decode: {exc}"
            raise CorruptStateError(msg) from exc
        if wire.v != _WIRE_VERSION:
            msg = f"prompt grouping bytes of version {wire.v}; this tailguard reads {_WIRE_VERSION}"
            raise CorruptStateError(msg)
        grouper = cls(wire.threshold, embed)
        if grouper.model_id != wire.model:
            msg = (
                f"prompt grouping was made with model {wire.model!r}, not {grouper.model_id!r}: "
                "similarities of two models are not comparable; rebuild it from the registry"
            )
            raise ConfigError(msg)
        rows: list[np.ndarray] = []
        for group in wire.groups:
            grouper._members[group.gid] = list(group.members)
            if group.rep is not None:
                grouper._rep_ids.append(group.gid)
                rows.append(np.frombuffer(group.rep, dtype="<f4").astype(np.float32))
        if rows:
            if len({r.shape[0] for r in rows}) != 1:
                msg = "prompt grouping bytes hold embeddings of different sizes"
                raise CorruptStateError(msg)
            grouper._reps = np.vstack(rows)
        for version, gid, parent in wire.versions:
            if gid not in grouper._members:
                msg = f"prompt version {version!r} names unknown group {gid!r}"
                raise CorruptStateError(msg)
            grouper._group_of[version] = gid
            grouper._parent[version] = parent
        return grouper


# -- the bundled model -------------------------------------------------------

_CONFIG: Final = "l2_supercat"
_DIM: Final = 256
_MODEL_ID: Final = f"wordllama/{_CONFIG}_{_DIM}"


class WordLlamaEmbedder:
    """wordllama's bundled ``l2_supercat`` 256-d model, loaded from the wheel's own files."""

    model_id: Final = _MODEL_ID

    def __init__(self, model: Any) -> None:
        self._model = model

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        rows: np.ndarray = self._model.embed(list(texts), norm=True)
        return rows


@functools.cache
def wordllama_embedder() -> WordLlamaEmbedder:
    """The bundled model, loaded once per process, never from the network.

    ``WordLlama.load`` looks for the shipped tokenizer in ``wordllama/tokenizer/``
    while the wheel ships it in ``wordllama/tokenizers/``, and then downloads it
    from Hugging Face; so the weights and tokenizer files are opened here and
    handed to ``WordLlamaInference`` directly. Importing wordllama calls
    ``logging.basicConfig``; the root logger is put back as it was.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        from importlib.resources import files

        from safetensors import safe_open
        from tokenizers import Tokenizer
        from wordllama import WordLlamaInference
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        msg = f"prompt grouping needs the wordllama package ({exc}); pip install wordllama"
        raise ConfigError(msg) from exc
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    package = files("wordllama")
    weights = package / "weights" / f"{_CONFIG}_{_DIM}.safetensors"
    tokenizer_file = package / "tokenizers" / f"{_CONFIG}_tokenizer_config.json"
    if not (weights.is_file() and tokenizer_file.is_file()):
        msg = (
            f"the wordllama package lacks its bundled {_CONFIG} files ({weights}, "
            f"{tokenizer_file}); reinstall it from PyPI"
        )
        raise ConfigError(msg)
    with safe_open(str(weights), framework="np", device="cpu") as f:
        table = f.get_tensor("embedding.weight")
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    return WordLlamaEmbedder(WordLlamaInference(table, tokenizer))
