"""What the commands share: how they open a dataset and read their options (`--storage-option KEY=VALUE`), the
argument types, the help layout and the parser of a command, how they print sizes, counts and tables, and an
error's message in the command line's words (`in_cli_words`)."""
from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import sys
from typing import Any, Callable, NoReturn, Sequence

from ..core.storage_layout import MAX_SHARD_BYTES
from ..loader import Dataset

Command = Callable[..., argparse.ArgumentParser]  # makes a command's parser: (name, help, description=None)


def parse_storage_option(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` from the command line; VALUE is read as JSON when it is JSON (true, 3, {"a": 1}), else text."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--storage-option: expected KEY=VALUE, got {text!r}")
    try:
        return key.strip(), json.loads(value)
    except ValueError:
        return key.strip(), value


def in_cli_words(exc: BaseException) -> str:
    """An error's message as the command line shows it: its `cli` wording if it has one."""
    return getattr(exc, "cli", None) or str(exc)


def plural(n: int, one: str, many: str | None = None) -> str:
    """"1 scene", "2 scenes", "1,024 batches"."""
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def rows_text(rows: dict[str, int]) -> str:
    """"1 scene, 248 frames, ...": table names are plural; one row of a table drops the "s"."""
    return ", ".join(plural(n, t[:-1] if t.endswith("s") else t, t) for t, n in rows.items())


def binary_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def format_info(info: dict) -> str:
    """A readable table of `Dataset.info()`, then each table's fields. Tables in zarr v3 also show the rows of a
    shard and the shards stored, beside the chunks (inner chunks, when sharded)."""
    v3 = any(t.get("zarr_format") == 3 for t in info.values())
    head = f"{'table':<22}{'rows':>14}{'chunk rows':>12}{'chunks':>8}" + \
        (f"{'shard rows':>12}{'shards':>8}" if v3 else "") + f"{'bytes':>12}{'stored':>12}{'ratio':>7}"
    lines = [head, "-" * len(head)]
    for name, t in info.items():
        ratio = f"{t['ratio']:.2f}" if t["ratio"] is not None else "-"
        shards = ""
        if v3:
            rows = f"{t['shard_rows']:,}" if t.get("shard_rows") else "-"
            shards = f"{rows:>12}{t['shards_initialized']:>8,}" if "shards_initialized" in t else f"{'-':>12}{'-':>8}"
        chunks = f"{t['chunks_initialized']:,}" if t["chunks_initialized"] is not None else "?"
        lines.append(f"{name:<22}{t['rows']:>14,}{t['chunk_rows']:>12,}{chunks:>8}{shards}"
                     f"{binary_size(t['bytes']):>12}{binary_size(t['bytes_stored']):>12}{ratio:>7}")
    lines.append("")
    for name, t in info.items():
        fields = ", ".join(f"{f[0]} {f[1]}{tuple(f[2]) if len(f) == 3 else ''}" for f in t["dtype"])
        lines.append(f"{name}: {fields}")
    return "\n".join(lines)


def show_progress(args: argparse.Namespace) -> bool:
    """Progress bars go to stderr, and only to a terminal (not to a log file or a CI console) unless --quiet."""
    return not args.quiet and sys.stderr.isatty()


def store_options(args: argparse.Namespace) -> dict:
    """--storage-option KEY=VALUE, repeated (fsspec's own environment configuration applies too)."""
    return dict(parse_storage_option(text) for text in args.storage_option or [])


def open_dataset(args: argparse.Namespace) -> Dataset:
    if args.path.startswith(("grpc://", "grpc+tls://")):
        raise ValueError(f"{args.path}: a zarrfeed server, not a dataset's store; `zarrfeed {args.command}` reads a "
                         "directory, a .zip or an fsspec URL. A server's batches are read with zarrfeed.flight."
                         "RemoteLoader in Python; `zarrfeed info` and `zarrfeed status` show what it serves")
    return Dataset.open(args.path, storage_options=store_options(args),
                        verify_chunks=not getattr(args, "no_verify", False))


def add_format_args(p: argparse.ArgumentParser, default: int = 2) -> None:
    """--zarr-format and --shard-bytes, for a command that makes a dataset."""
    p.add_argument("--zarr-format", type=int, choices=(2, 3), default=default,
                   help=f"zarr format of the new dataset (default {default}): 2 is what L5Kit's own code and "
                   "zarr-python read as records; 3 is sharded, a crc32c checksum on every chunk: fewer objects on "
                   "an object store")
    p.add_argument("--shard-bytes", type=shard_bytes_arg, metavar="N",
                   help="with --zarr-format 3: decoded bytes of a shard at most, e.g. 64M (default 16M)")


def bytes_arg(text: str) -> int:
    """A size: bytes, or with K, M or G (powers of 1024)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    try:
        value = int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or with K, M or G)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a size must be at least 1 byte, got {text!r}")
    return value


def shard_bytes_arg(text: str) -> int:
    """An argparse type: a shard's size (`bytes_arg`), at most `MAX_SHARD_BYTES`."""
    value = bytes_arg(text)
    if value > MAX_SHARD_BYTES:
        raise argparse.ArgumentTypeError(f"a shard holds at most 2G ({MAX_SHARD_BYTES:,} bytes), got {text!r}")
    return value


def _read(text: str, kind: Callable[[str], Any], what: str) -> Any:
    """`kind(text)`, or argparse's one line saying what was expected."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def seconds_arg(text: str) -> float:
    """An argparse type: a number of seconds > 0."""
    value = _read(text, float, "a number of seconds")
    if not (value > 0 and math.isfinite(value)):  # (inf: status --json would print Infinity, not JSON)
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds > 0, got {text!r}")
    return value


def count_arg(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    n = _read(text, int, "a whole number")
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {n}")
    return n


def positive_arg(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    n = _read(text, int, "a whole number")
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {n}")
    return n


def port_arg(text: str) -> int:
    """An argparse type: a TCP port, 0-65535 (0: a free one)."""
    n = _read(text, int, "a port number")
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0-65535, got {n}")
    return n


def fraction_arg(text: str) -> float:
    """An argparse type: a number in [0, 1)."""
    value = _read(text, float, "a number in [0, 1)")
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text}")
    return value


def file_arg(text: str) -> str:
    """An argparse type: a file that exists and can be read (a token, a certificate)."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text}" if not os.path.exists(text) else
                                         f"not a file: {text}")
    if not os.access(text, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text} (permission denied)")
    return text


def pem_arg(text: str) -> str:
    """An argparse type: a PEM file (a certificate or key), read once here to tell one from another file."""
    with open(file_arg(text), "rb") as f:
        if b"-----BEGIN " not in f.read(1 << 20):
            raise argparse.ArgumentTypeError(f"{text}: not a PEM file (no -----BEGIN line)")
    return text


def chunks_arg(text: str) -> dict[str, int]:
    """An argparse type: TABLE=ROWS[,TABLE=ROWS...], each ROWS a whole number >= 1."""
    chunks = {}
    for item in text.split(","):
        table, _, rows = item.partition("=")
        if not table.strip() or not rows.strip().isdigit() or int(rows) < 1:
            raise argparse.ArgumentTypeError(f"{item.strip()!r}: expected TABLE=ROWS, ROWS a whole number >= 1")
        if table.strip() in chunks:
            raise argparse.ArgumentTypeError(f"table {table.strip()!r} given twice")
        chunks[table.strip()] = int(rows)
    return chunks


class Help(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows each option's default, except where there is none to show (a flag's is its absence)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is argparse.SUPPRESS or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


class CommandParser(argparse.ArgumentParser):
    """A command's parser. An option it does not know is refused first (before "one of --synthetic --from is
    required"), under the command's own usage rather than the top level's, naming the option it resembles."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        for token in list(args or []):
            if token == "--":
                break
            name = token.split("=", 1)[0]
            if token.startswith("-") and token != "-" and not token[1:2].isdigit() and not self._knows(name):
                self.error(f"unrecognized argument {name}{self._close_to(name)}")
        parsed, extra = super().parse_known_args(args, namespace)
        if extra:
            hint = f"; did you mean --out {extra[0]}?" if "--out" in self._option_string_actions else ""
            self.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
        return parsed, extra

    def _knows(self, name: str) -> bool:
        """An option of this command, or an abbreviation of exactly one (argparse accepts those)."""
        if name in self._option_string_actions:
            return True
        return name.startswith("--") and sum(o.startswith(name) for o in self._option_string_actions) == 1

    def _close_to(self, name: str) -> str:
        """A hint: the argument given without a flag that this flag names (`--out` of `ingest OUT`), else the
        option this resembles."""
        for action in self._positionals._group_actions:
            if action.dest.replace("_", "-") == name.lstrip("-").lower():
                shown = action.metavar or action.dest
                return f"; {shown} is given without a flag: {self.prog} [options] {shown}"
        close = difflib.get_close_matches(name, [o for o in self._option_string_actions if o.startswith("--")], n=1)
        return f"; did you mean {close[0]}?" if close else ""


class TopParser(argparse.ArgumentParser):
    """The `zarrfeed` parser: a command it does not know is refused naming the command it resembles."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        wrong = re.match(r"argument command: invalid choice: '([^']*)'", message)
        commands = self._subparsers._group_actions[0].choices if self._subparsers else {}  # type: ignore[union-attr]
        if wrong and commands:
            close = difflib.get_close_matches(wrong.group(1), list(commands), n=1)
            message = (f"no command {wrong.group(1)!r}{f'; did you mean {close[0]}?' if close else ''} "
                       f"(commands: {', '.join(commands)})")
        super().error(message)


class Sized:
    """An iterator with a known length, for the progress bar's total."""

    def __init__(self, it, n: int) -> None:
        self.it, self.n = it, n

    def __iter__(self):
        return iter(self.it)

    def __len__(self) -> int:
        return self.n
