"""A griffe extension for the API reference: the options a function takes as `**options: Unpack[X]` show their
defaults. griffe's `unpack_typeddict` lists them as keyword-only parameters with the default "..." (a
TypedDict holds no defaults); zarrfeed keeps them in a dataclass beside it (`DEFAULTS`), read here without
importing anything, as the rest of the reference is. Listed after `unpack_typeddict` in mkdocs.yml: it notes
which TypedDict each function unpacks as the function is visited, and fills the defaults in once the package
is loaded, after `unpack_typeddict` has listed the options."""
from __future__ import annotations

import ast
import re
from typing import Any

from griffe import Class, DocstringSectionParameters, ExprSubscript, Extension, Function, ParameterKind

DEFAULTS = {"LoaderOptions": "Options", "RemoteOptions": "Remote", "WriteOptions": "Writes"}  # in one module
UNPACK = {"typing.Unpack", "typing_extensions.Unpack"}


class OptionDefaults(Extension):
    def __init__(self) -> None:
        self.unpacked: dict[str, str] = {}  # a function's path -> the TypedDict it unpacks

    def on_function_instance(self, *, func: Function, **kwargs: Any) -> None:
        for parameter in func.parameters:
            kind = parameter.annotation
            if (parameter.kind is ParameterKind.var_keyword and isinstance(kind, ExprSubscript)
                    and kind.canonical_path in UNPACK):
                self.unpacked[func.path] = kind.slice.canonical_path

    def on_function(self, *, func: Function, **kwargs: Any) -> None:
        module, _, name = self.unpacked.get(func.path, "").rpartition(".")
        if name in DEFAULTS:
            _fill(func, func.modules_collection[f"{module}.{DEFAULTS[name]}"])

    def on_class(self, *, cls: Class, **kwargs: Any) -> None:
        """The TypedDict's own page: `unpack_typeddict` gives it an `__init__` of its keys."""
        if cls.name in DEFAULTS and "__init__" in cls.members:
            _fill(cls.members["__init__"], cls.parent.members[DEFAULTS[cls.name]])  # type: ignore[union-attr]


def _fill(func: Any, holder: Any) -> None:
    """`func`'s parameters (and their docstring entries) defaulting to "..." get the defaults of `holder`'s
    option dataclasses (its `GROUPS`, or itself): a module constant's own value (`1 << 30`, not
    `DEFAULT_SHUFFLE_BYTES`), and "<not given>" for the options its `NOT_GIVEN` names (as `help()` shows them:
    `zarrfeed.core.keywords.spelled_out`)."""
    if not isinstance(holder, Class):
        return
    members = holder.all_members
    unset = ast.literal_eval(str(members["NOT_GIVEN"].value)) if "NOT_GIVEN" in members else ()
    values = {n: "<not given>" if n in unset else v for n, v in _defaults(holder).items()}
    for parameter in func.parameters:
        if parameter.default == "..." and parameter.name in values:
            parameter.default = values[parameter.name]
    for section in func.docstring.parsed if func.docstring else ():
        if isinstance(section, DocstringSectionParameters):
            for documented in section.value:
                if documented.value == "..." and documented.name in values:
                    documented.value = values[documented.name]


def _defaults(holder: Any) -> dict[str, str]:
    """Option name -> its default as written, of an option dataclass or of one made of groups (`GROUPS`: a dict
    of field -> group class, each resolved in the holder's module)."""
    members = holder.all_members
    if "GROUPS" in members:
        out: dict[str, str] = {}
        for name in re.findall(r":\s*(\w+)", str(members["GROUPS"].value)):
            group = holder.module.members[name]
            out.update(_defaults(getattr(group, "final_target", group)))
        return out
    return {n: _value(holder, str(m.value)) for n, m in members.items()
            if getattr(m, "value", None) is not None and n not in ("NOT_GIVEN", "GROUPS") and not m.is_function}


def _value(holder: Class, text: str) -> str:
    """A default as its value when it names a constant of the module (or one it imports), else as written."""
    if not text.isidentifier() or text in ("None", "True", "False"):
        return text
    try:
        return str(holder.module.members[text].value)  # (an imported name resolves through griffe's alias)
    except (KeyError, AttributeError, Exception):  # noqa: BLE001 (griffe raises its own alias errors)
        return text
