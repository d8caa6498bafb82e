"""Reading user files with a bound, writing outputs safely, and showing names on one line.

* :func:`read_text_bounded` reads at most :data:`MAX_SPEC_BYTES` (``/dev/zero`` given as a spec
  ended in an unbounded read) and turns every ``OSError`` (a 10,000-character name:
  ENAMETOOLONG) or undecodable byte into one :class:`SpecError` line.
* :func:`parse_toml` / :func:`parse_json` refuse a document nested too deeply (RecursionError)
  and one that is not a table / an object.
* :func:`atomic_write` writes a temporary file in the target's folder and renames it over the
  target (``os.replace``): a reader sees the old or the new file, never a torn one.
* :func:`refuse_input_as_output` refuses an output path that names one of the command's inputs.
* :func:`plain_name` refuses control characters (a newline in a model name reached an emitted
  TOML file as live tables); :func:`shown` prints any value on one short line.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import tomllib
import unicodedata
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from perfmodel.core.errors import SpecError

__all__ = [
    "MAX_SPEC_BYTES",
    "atomic_write",
    "input_files",
    "parse_json",
    "parse_toml",
    "plain_name",
    "read_text_bounded",
    "refuse_input_as_output",
    "same_file",
    "shown",
]

MAX_SPEC_BYTES = 16 * 2**20
"""Largest spec, calibration or runs file read [bytes] (the shipped ones are under 1 MiB)."""

_SHOWN_CHARS = 120


def shown(value: Any, limit: int = _SHOWN_CHARS) -> str:
    """``value`` as text on one line: control characters escaped, cut to ``limit`` characters."""
    text = "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
        for ch in str(value)
    )
    return text if len(text) <= limit else text[: limit - 3] + "..."


def plain_name(value: str, what: str = "name") -> str:
    """``value`` unchanged, or :class:`SpecError` where it holds a control or line-separator
    character (category Cc, Zl, Zp), which no name written into a file may carry."""
    bad = [ch for ch in value if unicodedata.category(ch) in ("Cc", "Zl", "Zp")]
    if bad:
        raise SpecError(f"{what} '{shown(value)}': control character {bad[0]!r} is not allowed "
                        "in a name")
    return value


def read_text_bounded(path: str | Path, fmt: str = "text", limit: int = MAX_SPEC_BYTES) -> str:
    """The UTF-8 text of ``path``, at most ``limit`` bytes; :class:`SpecError` otherwise."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as err:
        raise SpecError(f"{shown(path)}: cannot read: {err.strerror or err}") from None
    if len(data) > limit:
        raise SpecError(f"{shown(path)}: larger than {limit / 2**20:g} MiB: not a {fmt} file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{shown(path)}: not a text file (not UTF-8): expected {fmt}") from None


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """A TOML document's table; :class:`SpecError` (one line) when it is not valid TOML."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{shown(source)}: not valid TOML: {err}") from None
    except RecursionError:
        raise SpecError(f"{shown(source)}: not valid TOML: nested too deeply") from None
    except ValueError as err:  # an integer of over 4,300 digits
        raise SpecError(f"{shown(source)}: not valid TOML: {shown(err)}") from None


def parse_json(text: str, source: str, *, want_object: bool = True) -> Any:
    """A JSON document (an object unless ``want_object`` is false); :class:`SpecError` else."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise SpecError(f"{shown(source)}: not valid JSON: {err}") from None
    except RecursionError:
        raise SpecError(f"{shown(source)}: not valid JSON: nested too deeply") from None
    except ValueError as err:  # an integer of over 4,300 digits
        raise SpecError(f"{shown(source)}: not valid JSON: {shown(err)}") from None
    if want_object and not isinstance(data, dict):
        raise SpecError(f"{shown(source)}: expected a JSON object {{...}}, got "
                        f"{type(data).__name__} {shown(data, 40)}")
    return data


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` name the same file (same inode, or the same resolved path)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        try:
            return Path(a).resolve() == Path(b).resolve()
        except (OSError, RuntimeError, ValueError):
            return False


def input_files(items: Iterable[Any]) -> list[Path]:
    """The existing files among ``items`` (paths; a folder stands for the files in it;
    anything else, such as a preset name or a spec object, is skipped)."""
    out: list[Path] = []
    for item in items:
        if not isinstance(item, (str, Path)) or str(item) == "":
            continue
        p = Path(item)
        with contextlib.suppress(OSError, ValueError):
            if p.is_dir():
                out += [f for f in p.iterdir() if f.is_file()]
            elif p.is_file():
                out.append(p)
    return out


def refuse_input_as_output(output: str | Path, inputs: Iterable[Any], option: str) -> None:
    """:class:`SpecError` when ``output`` is empty or names one of the files of ``inputs``
    (see :func:`input_files`)."""
    if str(output) == "":
        raise SpecError(f"{option} '': give a file or folder name")
    for item in input_files(inputs):
        if same_file(output, item):
            raise SpecError(f"{option} {shown(output)}: is one of this command's inputs "
                            f"({shown(item)}); write the output elsewhere")


def _new_file_mode(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder renamed over it:
    readers and concurrent writers see a whole file, never a torn one."""
    p = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:100]}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _new_file_mode(p))
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
