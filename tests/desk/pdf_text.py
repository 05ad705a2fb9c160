"""The text of a PDF fpdf2 wrote, for tests (no PDF reader is installed): each font's ToUnicode map applied to
the strings its text operators show. Enough for fpdf2's output, not a general PDF parser."""

import re
import zlib

OBJECT = re.compile(rb"(\d+) 0 obj(.*?)endobj", re.S)
STREAM = re.compile(rb"stream\r?\n(.*?)\r?\nendstream", re.S)
ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"b": b"\b", b"f": b"\f"}


def _stream(body: bytes) -> bytes:
    raw = STREAM.search(body).group(1)
    return zlib.decompress(raw) if b"/FlateDecode" in body.split(b"stream")[0] else raw


def _utf16(hexdigits: bytes) -> str:
    return bytes.fromhex(hexdigits.decode()).decode("utf-16-be")


def _cmap(data: bytes) -> dict[int, str]:
    found = {}
    for block in re.findall(rb"beginbfchar(.*?)endbfchar", data, re.S):
        for code, text in re.findall(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>", block):
            found[int(code, 16)] = _utf16(text)
    for block in re.findall(rb"beginbfrange(.*?)endbfrange", data, re.S):
        for low, high, first in re.findall(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>", block):
            start = ord(_utf16(first))
            for offset in range(int(high, 16) - int(low, 16) + 1):
                found[int(low, 16) + offset] = chr(start + offset)
    return found


def _unescape(literal: bytes) -> bytes:
    out, i = bytearray(), 0
    while i < len(literal):
        if literal[i : i + 1] == b"\\":
            nxt = literal[i + 1 : i + 2]
            octal = re.match(rb"[0-7]{1,3}", literal[i + 1 : i + 4])
            if octal:
                out.append(int(octal.group(0), 8) & 0xFF)
                i += 1 + len(octal.group(0))
                continue
            out += ESCAPES.get(nxt, nxt)
            i += 2
        else:
            out += literal[i : i + 1]
            i += 1
    return bytes(out)


def pdf_text(data: bytes) -> str:
    objects = {int(n): body for n, body in OBJECT.findall(data)}
    fonts = {}
    for name, number in re.findall(rb"/(F\d+) (\d+) 0 R", data):
        to_unicode = re.search(rb"/ToUnicode (\d+) 0 R", objects[int(number)])
        fonts[name] = _cmap(_stream(objects[int(to_unicode.group(1))])) if to_unicode else {}
    lines = []
    for body in objects.values():
        if not STREAM.search(body) or b"/Length1" in body:
            continue
        try:
            content = _stream(body)
        except zlib.error:
            continue
        font = {}
        for match in re.finditer(rb"/(F\d+) [\d.]+ Tf|\(((?:\\.|[^\\)])*)\) Tj", content, re.S):
            if match.group(1):
                font = fonts.get(match.group(1), {})
                continue
            raw = _unescape(match.group(2))
            lines.append("".join(font.get(int.from_bytes(raw[i : i + 2], "big"), "?") for i in range(0, len(raw), 2)))
    return "\n".join(lines)
