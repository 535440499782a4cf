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


def unknown_name_message(kind: str, name: str, valid: Iterable[str]) -> str:
    """'unknown model 'llama13b'; did you mean 'llama_13b'? valid: ...'."""
    choices = sorted(valid)
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    hint = f" did you mean {close[0]!r}?" if close else ""
    return f"unknown {kind} {name!r};{hint} valid {kind} names: {', '.join(choices)}"
