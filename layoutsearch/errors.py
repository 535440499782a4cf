"""The one exception type a user of layoutsearch sees for their own mistakes.

Errors a user can cause name the field, the value and the rule, and suggest a fix;
assertions are kept for our own bugs.

    raise LayoutSearchError(unknown_name_message("model", "llama13b", ["llama_13b"]))
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class LayoutSearchError(ValueError):
    """A user's input cannot be used; the message says which field, value and rule."""


CLOSE_RATIO = 0.6
"""difflib's similarity from which a valid name is offered for a mistyped one (its
get_close_matches default)."""


def closest_names(name: str, valid: Iterable[str]) -> list[str]:
    """The valid names a mistyped `name` most likely meant, best first ([] if none is close).

    Case is ignored. A name that starts a valid one is taken as cut short ('h100' meant
    'h100_sxm'), and one that a valid name starts as given a suffix ('h200_sxm' meant
    'h200'), which edit distance alone misses (it would offer 'h200' and 'h100_sxm');
    among several, the most similar ones are offered together ('a100': 'a100_40gb' and
    'a100_80gb'; 'llama_70b': 'llama2_70b' and 'llama3_70b').
    """
    by_lower = {choice.lower(): choice for choice in valid}
    key = name.lower()
    if key in by_lower:
        return [by_lower[key]]
    ratio = {c: difflib.SequenceMatcher(None, key, c).ratio() for c in by_lower}
    started = [c for c in by_lower if c.startswith(key)] if key else []
    if not started:
        extended = [c for c in by_lower if key.startswith(c)]
        started = [max(extended, key=len)] if extended else []
    close = started or [c for c in by_lower if ratio[c] >= CLOSE_RATIO]
    if not close:
        return []
    best = max(ratio[c] for c in close)
    return sorted(by_lower[c] for c in close if ratio[c] == best)


def type_of(value: object) -> str:
    """`value`'s type with its article, for "not an int", "not a list"."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def unknown_name_message(kind: str, name: object, valid: Iterable[str]) -> str:
    """'unknown model 'llama13b'; did you mean 'llama_13b'? valid: ...'."""
    choices = sorted(valid)
    if not isinstance(name, str):  # None or a number where a name belongs
        return f"{kind} {name!r} is not a name; valid {kind} names: {', '.join(choices)}"
    close = closest_names(name, choices)
    if len(close) == 1:
        hint = f" did you mean {close[0]!r}?"
    elif close:
        hint = f" did you mean one of {', '.join(repr(c) for c in close)}?"
    else:
        hint = ""
    return f"unknown {kind} {name!r};{hint} valid {kind} names: {', '.join(choices)}"
