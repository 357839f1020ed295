"""Lenient repair of the JSON damage real Kineto writers leave inside a trace.

Some profiler versions write text that no strict JSON parser accepts, although every event in it
is whole. The damages known and repaired here, each counted by kind:

=====================  ========================================================================
kind                   what was written, and the repair
=====================  ========================================================================
``raw backslashes``    a Windows path written without escaping (``C:\\Users\\me\\train.py`` with
                       single backslashes, so ``\\U`` is an invalid escape while ``\\t`` and
                       ``\\n`` would silently become a tab and a newline). A string with an
                       invalid escape, or a drive letter followed by one backslash, is taken
                       literally: every backslash in it is a backslash.
``control characters`` raw bytes 0x00-0x1F inside a string; kept as the characters they are.
``not UTF-8``          bytes that are not UTF-8 (a Latin-1 ``µ``, 0xB5, in a kernel name); each
                       such byte is read as the Latin-1 character it is.
``non-standard values``  unquoted ``N/A``, ``NaN``, ``Infinity`` (Python's ``json.dump`` writes
                       the last two) or a number past a float's range (``1e400``) in place of a
                       value; each becomes ``null``.
``byte-order mark``    a UTF-8 byte-order mark before the text; removed.
``unescaped quotes``   a ``"`` inside a name written without its backslash: PyTorch's profiler
                       writes a ``record_function("say \"hi\"")`` range as ``"name": "say "hi""``.
                       On a line of one ``"key": "value"`` pair (how Kineto writes names) whose
                       value is not a valid string, every inner ``"`` is taken literally. A line
                       that parses as JSON pairs (``"a": "b", "c": "d"``) is left as it is.
=====================  ========================================================================

The repair runs only after the strict parse failed, so clean files pay nothing. Positions in the
repaired text map back to the original (:meth:`Repaired.original_pos`) so that damage that
cannot be repaired is reported where it is in the file.
"""

from __future__ import annotations

import bisect
import codecs
import re
from dataclasses import dataclass, field

import orjson

# Runs of text that need no look: structure, numbers and strings of plain ASCII, taken in one
# match so that a clean file costs a few regex steps per line, not one per string.
_CLEAN = rb'(?:[^"\\\x00-\x08\x0b\x0c\x0e-\x1f\x80-\xff0-9NIn-]+|"[^"\\\x00-\x1f\x80-\xff]*")+'
# Then: a JSON string that may need repair (escapes consumed whole, so an escaped quote does not
# end it), a number (checked for overflow), one of the non-standard bare values, or any other byte.
_TOKEN = re.compile(
    _CLEAN + rb'|(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)'
    rb'|(?P<bare>N/A|-?Infinity|-?NaN|-?nan|-?inf\b)|.', re.DOTALL
)
_HUGE_DIGITS = 309  # a float64 overflows past 1.8e308: a number that long, or with such an exponent
_ESCAPE = re.compile(rb"\\(.)", re.DOTALL)
_VALID_ESCAPE = frozenset(b'"\\/bfnrt')
_HEX4 = re.compile(rb"[0-9A-Fa-f]{4}")
# A drive letter, a colon and a single backslash: a Windows path written raw.
_RAW_DRIVE = re.compile(rb"(?<![A-Za-z])[A-Za-z]:\\(?![\\\"/])")
_CONTROL = re.compile(rb"[\x00-\x1f]")
_BOM = b"\xef\xbb\xbf"

RAW_BACKSLASHES = "raw backslashes"
CONTROL_CHARACTERS = "control characters"
NOT_UTF8 = "not UTF-8"
NON_STANDARD = "non-standard values"
BOM = "byte-order mark"
UNESCAPED_QUOTES = "unescaped quotes"
# Each kind of repair in a warning's words, and what its count counts.
WORDING = {
    RAW_BACKSLASHES: ("unescaped backslashes (Windows paths), taken literally", "string"),
    CONTROL_CHARACTERS: ("raw control characters, kept as characters", "string"),
    NOT_UTF8: ("bytes that are not UTF-8, read as Latin-1", "string"),
    NON_STANDARD: ("N/A, NaN, Infinity or a number too large for a float (1e400) in place of a value, read as null",
                   "value"),
    BOM: ("a byte-order mark before the JSON text, removed", "file"),
    UNESCAPED_QUOTES: ('double quotes inside a name written without escaping (record_function("a \\"b\\"")), '
                       "taken literally", "string"),
}

# One `"key": "value"` pair on a line of its own, as Kineto writes an event's name: the value runs
# to the last quote of the line that only a comma (or nothing) follows.
_PAIR_LINE = re.compile(rb'(?m)^(?P<lead>[ \t]*"[^"\\\r\n]*"[ \t]*:[ \t]*")(?P<body>[^\r\n]*)"(?=[ \t]*,?[ \t]*\r?$)')
# A quote no backslash escapes (an even run of backslashes before it escapes only themselves).
_BARE_QUOTE = re.compile(rb'(?<!\\)((?:\\\\)*)"')


def _latin1_fallback(err: UnicodeDecodeError):
    # Each undecodable byte is the Latin-1 character of the same value (0xB5 -> "µ").
    return "".join(chr(b) for b in err.object[err.start : err.end]), err.end


codecs.register_error("perfscope-latin1", _latin1_fallback)


@dataclass
class _Spans:
    """Where one pass of the repair replaced text: to map a position back through it."""

    new_starts: list[int] = field(default_factory=list)  # start of each replacement in the output
    orig: list[tuple[int, int, int]] = field(default_factory=list)  # its start and end in the input, new length

    def original_pos(self, pos: int) -> int:
        k = bisect.bisect_right(self.new_starts, pos) - 1
        if k < 0:
            return pos
        new_start = self.new_starts[k]
        orig_start, orig_end, new_len = self.orig[k]
        if pos < new_start + new_len:
            return orig_start
        return orig_end + (pos - new_start - new_len)


@dataclass
class Repaired:
    """The outcome of :func:`repair_json`.

    Attributes:
        text: The repaired JSON text (bytes).
        counts: Number of strings (or values) repaired, by kind (see the module docstring).
        examples: The first five repaired strings of each kind, as they read after the repair.
    """

    text: bytes
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)  # kind -> the first repaired strings
    _passes: list[_Spans] = field(default_factory=list, repr=False)  # in the order they ran
    _shift: int = field(default=0, repr=False)  # bytes removed at the very start (a BOM)

    def original_pos(self, pos: int) -> int:
        """The byte offset in the original text of offset ``pos`` in the repaired text."""
        for spans in reversed(self._passes):
            pos = spans.original_pos(pos)
        return pos + self._shift

    @property
    def any(self) -> bool:
        return any(self.counts.values())

    def count(self, kind: str, token: bytes | None = None) -> None:
        """Count one repair of ``kind``; keep the repaired string as an example (first five)."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        shown = self.examples.setdefault(kind, [])
        if token is not None and len(shown) < 5:
            try:
                shown.append(str(orjson.loads(token))[:80])
            except orjson.JSONDecodeError:  # a string the repair could not make whole
                shown.append(token[1:-1].decode("utf-8", "replace")[:80])


def _replace(text: bytes, replacements, out: Repaired) -> bytes:
    """``text`` with each ``(start, end, new bytes)`` (in order, not overlapping) put in; the
    pass is recorded in ``out`` so that positions map back through it."""
    pieces: list[bytes] = []
    spans = _Spans()
    last = out_len = 0
    for start, end, fixed in replacements:
        pieces.append(text[last:start])
        out_len += start - last
        spans.new_starts.append(out_len)
        spans.orig.append((start, end, len(fixed)))
        pieces.append(fixed)
        out_len += len(fixed)
        last = end
    if not pieces:
        return text
    pieces.append(text[last:])
    out._passes.append(spans)
    return b"".join(pieces)


def _fix_quotes(text: bytes, out: Repaired):
    """The replacements of the ``unescaped quotes`` repair (see the module docstring)."""
    if b'"' not in text:
        return
    for m in _PAIR_LINE.finditer(text):
        body = m["body"]
        if b'"' not in body or not any(len(q.group(1)) % 2 == 0 for q in _BARE_QUOTE.finditer(body)):
            continue
        line = m.group(0)
        try:  # "a": "b", "c": "d" on one line is sound JSON, not a name holding quotes
            orjson.loads(b"{" + line + b"}")
            continue
        except orjson.JSONDecodeError:
            pass
        fixed = _BARE_QUOTE.sub(rb'\1\\"', body)
        out.count(UNESCAPED_QUOTES, b'"' + fixed + b'"')
        yield m.start("body"), m.end("body"), fixed


def _fix_string(s: bytes, repaired: Repaired) -> bytes:
    """One JSON string token (quotes included), repaired; ``s`` itself when it is sound."""
    kinds = []
    try:
        s.decode("utf-8")
    except UnicodeDecodeError:
        s = s.decode("utf-8", "perfscope-latin1").encode("utf-8")
        kinds.append(NOT_UTF8)
    # Backslashes before control characters: the escapes written for those must stay escapes.
    if b"\\" in s and _is_raw(s):
        # Every backslash is literal; one before the closing quote was an escaped quote and stays.
        s = b'"' + re.sub(rb'\\(?!")', rb"\\\\", s[1:-1]) + b'"'
        kinds.append(RAW_BACKSLASHES)
    if _CONTROL.search(s):
        s = _CONTROL.sub(lambda m: b"\\u%04x" % m.group(0)[0], s)
        kinds.append(CONTROL_CHARACTERS)
    for kind in kinds:
        repaired.count(kind, s)
    return s


def _is_raw(s: bytes) -> bool:
    """Whether a string token holds backslashes written without escaping."""
    if _RAW_DRIVE.search(s):
        return True
    for m in _ESCAPE.finditer(s):
        c = m.group(1)[0]
        if c == ord("u"):
            if not _HEX4.match(s, m.end()):
                return True
        elif c not in _VALID_ESCAPE:
            return True
    return False


def repair_json(text: bytes) -> Repaired:
    """Repair the known damages of a Kineto JSON text (see the module docstring).

    Args:
        text: The whole file's text, as bytes.

    Returns:
        A :class:`Repaired` whose ``text`` is ``text`` itself when nothing needed repair.
    """
    out = Repaired(text)
    if text.startswith(_BOM):
        text, out._shift = text[len(_BOM):], len(_BOM)
        out.count(BOM)
    text = _replace(text, _fix_quotes(text, out), out)  # first: the token pass needs whole strings
    out.text = _replace(text, _fix_tokens(text, out), out)
    return out


def _fix_tokens(text: bytes, out: Repaired):
    """The replacements of every other repair, token by token."""
    for m in _TOKEN.finditer(text):
        if m.lastgroup == "str":
            tok = m.group(0)
            fixed = _fix_string(tok, out)
            if fixed is tok:
                continue
        elif m.lastgroup == "num":
            tok = m.group(0)
            if len(tok) < _HUGE_DIGITS and b"e" not in tok and b"E" not in tok:
                continue
            try:
                if abs(float(tok)) != float("inf"):
                    continue
            except ValueError:
                continue
            fixed = b"null"
            out.count(NON_STANDARD, b'"' + tok[:40] + b'"')
        elif m.lastgroup == "bare":
            fixed = b"null"
            out.count(NON_STANDARD)
        else:
            continue
        yield m.start(), m.end(), fixed
