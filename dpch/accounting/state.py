"""The composed state of a sequence of charges: what an accountant needs of the history, kept
exactly so that one more charge costs O(1) whatever the history's length.

Every accountant here composes through running sums (Σε, Σδ, Σε², Σρ, Σ S²/σ², …) and the number
of queries; `Accountant.sum_terms` gives the terms one query adds. The sums are kept as exact
rationals (`fractions.Fraction`: a float is a dyadic rational, so the sum of any number of floats
is exact), and rounded once when read. That is the same number `math.fsum` returns for the whole
list (both are the correctly rounded exact sum), so a decision made from the state equals the one
made by re-composing the history: never smaller, never larger (tests/test_ledger_incremental.py)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterable, Mapping


_SCALE = 1074  # every finite double is an integer multiple of 2^-1074 (the smallest subnormal)


def exact_sum(values: Iterable[float], start: Fraction = Fraction(0)) -> Fraction:
    """The exact sum of floats (no rounding at all): integers in units of 2^-1074, one Fraction at
    the end (Fraction additions term by term are far slower on long histories)."""
    acc = 0
    for v in values:
        num, den = float(v).as_integer_ratio()  # den is a power of two, at most 2^1074
        acc += num << (_SCALE + 1 - den.bit_length())
    return start + Fraction(acc, 1 << _SCALE) if acc else start


@dataclass(frozen=True)
class ComposedState:
    """`n` composed queries and the exact running sums, by name."""

    n: int = 0
    sums: Mapping[str, Fraction] = field(default_factory=dict)

    def extend(self, terms: Mapping[str, Iterable[float]]) -> "ComposedState":
        """The state after one more query whose terms are `terms` (Accountant.sum_terms)."""
        sums = dict(self.sums)
        for name, values in terms.items():
            sums[name] = exact_sum(values, sums.get(name, Fraction(0)))
        return ComposedState(self.n + 1, sums)

    @classmethod
    def compose(cls, terms_seq: Iterable[Mapping[str, Iterable[float]]]) -> "ComposedState":
        """The state of a whole sequence (the same as extending one query at a time)."""
        lists: dict[str, list[float]] = {}
        n = 0
        for terms in terms_seq:
            n += 1
            for name, values in terms.items():
                lists.setdefault(name, []).extend(values)
        return cls(n, {name: exact_sum(values) for name, values in lists.items()})

    def value(self, name: str) -> float:
        """The correctly rounded sum (equal to math.fsum of every term added)."""
        return float(self.sums.get(name, Fraction(0)))

    def to_json(self) -> str:
        return json.dumps({"n": self.n, "sums": {k: str(v) for k, v in sorted(self.sums.items())}}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ComposedState":
        """Raises ValueError (or TypeError/KeyError) on anything malformed: the caller recomputes."""
        d = json.loads(text)
        n = d["n"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError("bad query count")
        return cls(n, {str(k): Fraction(v) for k, v in d["sums"].items()})
