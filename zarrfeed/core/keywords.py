"""Keyword options taken as `**options` (the loaders' and writers' option declarations): an unknown name is
refused as Python refuses an unknown keyword argument of a function's own, naming the close one."""
from __future__ import annotations

import difflib
from typing import Any, Mapping


def refuse_unknown(given: Mapping[str, Any], known: list[str], who: str) -> None:
    """TypeError, as Python words it for a function's own parameters, for a name of `given` not `known`."""
    for name in given:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f". Did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"{who}.__init__() got an unexpected keyword argument {name!r}{hint}")
