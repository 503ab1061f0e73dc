"""E-mail addresses, URLs and file names, read symbol by symbol (点, 艾特, 斜杠 / dot, at, slash)."""

from __future__ import annotations

import re
from typing import Final

from .base import Lang
from .kind import Groups, Kind
from .numbers import en_digits, zh_digits

_TLD: Final = "com|net|org|cn|io|ai|edu|gov|info|co|uk|de|jp|me|tv|cc|app|dev|ly|be|gl|gg|fm"
_URL_TAIL: Final = r"[A-Za-z0-9\-._~/?#=&%+:]*[A-Za-z0-9/]"
_FILE_EXT: Final = ("pdf|docx?|xlsx?|pptx?|txt|csv|json|ya?ml|xml|html?|md|py|js|java|cpp|log|ini|toml|cfg|zip|tar|"
                    "gz|rar|exe|dmg|apk|png|jpe?g|gif|svg|webp|mp3|wav|mp4|mov|avi|mkv|flac|ogg|onnx|sql|ipynb|css|php")
"""Extensions that make ``name.ext`` a file name: common ones, none a short English word."""


def _email(lang: Lang, raw: str) -> str:
    words = {"zh": {".": "点", "@": "艾特", "_": "下划线", "-": "杠", "+": "加", "%": "百分号"},
             "en": {".": "dot", "@": "at", "_": "underscore", "-": "dash", "+": "plus", "%": "percent"}}[lang]
    out: list[str] = []
    for part in re.findall(r"[A-Za-z]+|\d+|.", raw):
        if part.isdigit():
            out.append(zh_digits(part) if lang == "zh" else en_digits(part))
        elif part in words:
            out.append(words[part])
        elif part.isalpha():
            out.append(part)
    return " ".join(out)


def _url(lang: Lang, raw: str) -> str:
    body = re.sub(r"^https?://", "", raw)
    words = {"zh": {".": "点", "/": "斜杠", "-": "杠", "_": "下划线", ":": "冒号", "?": "问号", "=": "等于",
                    "&": "和", "#": "井号", "~": "波浪号", "%": "百分号", "+": "加"},
             "en": {".": "dot", "/": "slash", "-": "dash", "_": "underscore", ":": "colon", "?": "question mark",
                    "=": "equals", "&": "and", "#": "hash", "~": "tilde", "%": "percent", "+": "plus"}}[lang]
    out: list[str] = []
    for part in re.findall(r"[A-Za-z]+|\d+|.", body):
        if part.isdigit():
            out.append(zh_digits(part) if lang == "zh" else en_digits(part))
        elif part.isalpha():
            out.append(part)
        elif part in words:
            out.append(words[part])
    return " ".join(out)


def _read_email(lang: Lang, g: Groups, before: str, after: str) -> str:
    return _email(lang, g("email"))


def _read_url(lang: Lang, g: Groups, before: str, after: str) -> str:
    return _url(lang, g("url"))


EMAIL: Final = Kind(
    "email",
    r"(?<![A-Za-z0-9._%+-])(?P<email>[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,})",
    _read_email, first=r"[A-Za-z0-9._%+-]")


URL: Final = Kind(
    "url",
    rf"(?P<url>(?:https?://|www\.){_URL_TAIL}"
    rf"|(?<![A-Za-z0-9.@/_-])(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+(?:{_TLD})(?![A-Za-z0-9-])"
    rf"(?:/{_URL_TAIL})?)",
    _read_url, first=r"[A-Za-z0-9]")


def _read_file_name(lang: Lang, g: Groups, before: str, after: str) -> str:
    return _url(lang, g("file"))


FILE_NAME: Final = Kind(
    "file_name",
    rf"(?<![A-Za-z0-9.@/_-])(?P<file>[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*\.(?i:{_FILE_EXT}))"
    r"(?![A-Za-z0-9_-])",
    _read_file_name, first=r"[A-Za-z0-9]")
"""A file name (``config.yaml``, ``report_v2.pdf``, ``archive.tar.gz``): its dots are read as 点 /
dot, not taken for the end of a sentence."""
