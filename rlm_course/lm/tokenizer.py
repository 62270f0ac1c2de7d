"""Character-level tokenizer with ``<pad>``, ``<bos>`` and ``<eos>``.

One token per character keeps every step of the course inspectable: a prompt such as ``"47+85="``
is six tokens, its answer ``"132"`` three more plus ``<eos>``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rlm_course.utils import is_integer

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)
# Every character a task of the course may use. Adding one changes vocab_size (and checkpoints).
CHARS = "0123456789+-*/()=,>: "


class CharTokenizer:
    """Maps text to token ids and back.

    Ids ``0, 1, 2`` are ``<pad>``, ``<bos>``, ``<eos>``; characters follow in the order of
    ``chars``.

    Raises:
        ValueError: from :meth:`encode` if the text holds a character outside the vocabulary.
    """

    def __init__(self, chars: str = CHARS) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError(f"CharTokenizer: duplicate characters in {chars!r}.")
        self.itos = list(SPECIALS) + list(chars)
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        unknown = sorted({c for c in text if c not in self.stoi or c in SPECIALS})
        if unknown:
            raise ValueError(
                f"CharTokenizer.encode: character(s) {unknown!r} in {text!r} are not in the "
                f"vocabulary {''.join(self.itos[3:])!r}; remove them or extend CHARS in "
                "rlm_course/lm/tokenizer.py (which changes vocab_size and invalidates checkpoints)."
            )
        ids = [self.stoi[c] for c in text]
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def decode(self, ids: Sequence[int] | Tensor, stop_at_eos: bool = True) -> str:
        """Text of ``ids``; specials are dropped and decoding stops at the first ``<eos>``.

        Raises:
            ValueError: for ids that are not one row of integers of the vocabulary (see
                :meth:`_id_list`).
        """
        ids = self._id_list(ids, "decode")
        out = []
        for i in ids:
            if i == self.eos_id and stop_at_eos:
                break
            if i >= 3:
                out.append(self.itos[i])
        return "".join(out)

    def _id_list(self, ids: Sequence[int] | Tensor, where: str) -> list[int]:
        """``ids`` as a list of ints, after refusing what would decode to the wrong text.

        Raises:
            ValueError: for a tensor of more than one row (decode each row), or an id outside
                ``0 .. vocab_size - 1`` (a negative one would wrap to the vocabulary's end).
        """
        if isinstance(ids, Tensor):
            if ids.dim() > 1:
                raise ValueError(f"{where}: ids of shape {tuple(ids.shape)}; decode one row at "
                                 f"a time ([tokenizer.{where}(row) for row in ids]).")
            ids = ids.tolist()
        ids = list(ids)
        bad = next((i for i in ids if not is_integer(i) or not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"{where}: id {bad!r} is not a token of this tokenizer (ids "
                             f"0..{self.vocab_size - 1}): decode the ids of a model built for it.")
        return ids

    def decode_response(self, ids: Sequence[int] | Tensor) -> str:
        """The text of a generated response, as the verifier must see it: up to the first
        ``<eos>`` (what follows is padding), with any other special token the policy sampled kept
        visible by name. (Dropping them, as :meth:`decode` does, would verify ``"4<pad>2"`` as the
        answer ``"42"``.)

        Raises:
            ValueError: as :meth:`decode`.
        """
        ids = self._id_list(ids, "decode_response")
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            out.append(self.itos[i])
        return "".join(out)

    def encode_prompts(self, prompts: Sequence[str],
                       device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
        """Left-padded batch of ``<bos> + prompt``, made on ``device``.

        Returns:
            tokens: ``(batch, max_len)`` int64; attention_mask: ``(batch, max_len)`` bool.

        Raises:
            ValueError: for no prompts, a single string (its characters would be read as
                one-character prompts), and the errors of :meth:`encode`.
        """
        if isinstance(prompts, str):
            raise ValueError(f"encode_prompts: give a list of prompts, e.g. [{prompts[:20]!r}] "
                             "(a string is read as one prompt per character).")
        rows = [self.encode(p, bos=True) for p in prompts]
        if not rows:
            raise ValueError("encode_prompts: no prompts; give at least one.")
        return self.left_padded(rows, device)

    def left_padded(self, rows: Sequence[list[int]],
                    device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
        """Token-id rows (e.g. prompts, or prompts with a partial response) left-padded to the
        longest, on ``device``: ``(tokens, attention_mask)``, each ``(len(rows), max_len)``."""
        width = max(len(r) for r in rows)
        padded = [[self.pad_id] * (width - len(r)) + list(r) for r in rows]
        real = [[False] * (width - len(r)) + [True] * len(r) for r in rows]
        return (torch.tensor(padded, dtype=torch.long, device=device),
                torch.tensor(real, dtype=torch.bool, device=device))
