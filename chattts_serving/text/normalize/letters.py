"""Letters read as words: English abbreviations and titles (``Dr. Chen`` -> Doctor Chen, ``etc.``
-> et cetera, ``Main St.`` -> Main Street, ``St. Louis`` -> Saint Louis) and Roman numerals
(``Ⅳ卷`` -> 四卷, ``第II章`` -> 第二章, ``World War II`` -> World War two, ``Louis XIV`` -> Louis
the fourteenth).

Roman numerals written in Latin capitals are read only where nothing else is meant: in Chinese
before a counter (II型, IV期) or after 第; in English after a word of :data:`ROMAN_AFTER_WORDS`
(Chapter IV, World War II) or a regnal name of :data:`REGNAL_NAMES` (Henry VIII). The
characters of Unicode's Number Forms block (Ⅰ..Ⅻ, ⅰ..ⅻ) are always numerals.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

from .base import Lang
from .context import NO_SENTENCE_END, NUMBER_MARK_WORDS
from .kind import Groups, Kind, alt_words
from .numbers import en_int, en_ordinal, zh_number
from .vocabulary import rows, words

TITLES: Final[dict[str, str]] = {title: reading for title, reading in rows("titles")}
"""Titles before a name, read as words; the dot is no sentence end."""
ABBREVIATIONS: Final = {abbr: reading for abbr, reading, _ in rows("abbreviations")}
"""Other abbreviations written with a dot; at the end of a sentence the dot also ends it."""

ROMAN_AFTER_WORDS: Final = words("roman_after_words")
"""English words after which Latin capitals are a Roman numeral read as a cardinal (World War
II -> World War two, Chapter IV -> Chapter four)."""
REGNAL_NAMES: Final = words("regnal_names")
"""Names after which a Roman numeral is a regnal number read ``the`` + ordinal (Louis XIV ->
Louis the fourteenth)."""
ROMAN_COUNTERS_ZH: Final = "".join(words("roman_counters_zh"))
"""Chinese counters after which Latin capitals are a Roman numeral (II型, IV期)."""

_ROMAN: Final = re.compile(r"M{0,3}(CM|CD|D?C{0,3})(XC|XL|L?X{0,3})(IX|IV|V?I{0,3})")
_VALUES: Final = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def roman_value(numeral: str) -> int | None:
    """The value of a Roman numeral (ASCII capitals or Unicode Number Forms: ``'XIV'``, ``'Ⅻ'``),
    None when it is not a well-formed one (``'IIII'``, ``'VX'``)."""
    plain = unicodedata.normalize("NFKC", numeral).upper()
    if not plain or not _ROMAN.fullmatch(plain):
        return None
    total = 0
    for i, c in enumerate(plain):
        v = _VALUES[c]
        total += -v if i + 1 < len(plain) and _VALUES[plain[i + 1]] > v else v
    return total


def _read_roman_numeral(lang: Lang, g: Groups, before: str, after: str) -> str:
    word = g("rm_word") or ""
    numeral = g("rm_num") or g("rm_zh") or g("rm_zh2") or g("rm_uni")
    value = roman_value(numeral)
    if value is None:  # not a numeral after all: read the letters as they are
        return word + numeral
    if lang == "zh":
        return word + zh_number(str(value))
    regnal = word.strip() in REGNAL_NAMES or re.search(rf"\b(?:{'|'.join(REGNAL_NAMES)})\s*$", before) is not None
    return word + (f"the {en_ordinal(value)}" if regnal else en_int(value))


def _read_abbreviation(lang: Lang, g: Groups, before: str, after: str) -> str:
    """A title or abbreviation as its word. St. is Saint before a name (St. Louis) unless a name
    precedes it, else Street (Main St.); Dr. right after a name is Drive (on Elm Dr., 5 Elm Dr.),
    else Doctor (a name counts when a lowercase word or a house number comes before it: the first
    word of a sentence is no street name). An abbreviation other than a title at the end of a
    sentence (etc. then a capital, or the text's end) also ends it."""
    abbr = g("ab")
    # a name right before it, not the sentence's first word (Elm Dr., 5th St.; not Visit St. Louis)
    prev_name = re.search(r"(?:\b[a-z]+\s+[A-Z][a-z]+|\d(?:st|nd|rd|th)|\b\d+[A-Z]?(?:\s+[A-Z][a-z]+)+)\s*$",
                          before) is not None
    next_name = re.match(r"\s+[A-Z]", after) is not None
    if abbr == "St":
        word = "Saint" if next_name and not prev_name else "Street"
    elif abbr == "Dr" and prev_name:
        word = "Drive"
    else:
        word = TITLES.get(abbr) or ABBREVIATIONS[abbr]
    is_title = word == "Saint" or (abbr in TITLES and word != "Drive")
    nxt = re.match(r"\s+([A-Z][a-z]*)\b", after)
    ends = not after.strip() or (nxt is not None and nxt.group(1) not in (*TITLES, *ABBREVIATIONS, "No"))
    if not is_title and abbr not in NO_SENTENCE_END and g("ab_dot") and ends:
        return word + "."
    return word


ABBREVIATION: Final = Kind(
    "abbreviation",
    rf"(?=[A-Za-z])(?<![A-Za-z.])(?P<ab>{alt_words(TITLES)}|{alt_words(ABBREVIATIONS)})(?P<ab_dot>\.)"
    r"|(?=v)(?<![A-Za-z.])(?P<ab_vs>vs)(?![A-Za-z])(?=\s)"
    rf"|(?=[pAP])(?<![A-Za-z.])(?P<ab_page>{alt_words(NUMBER_MARK_WORDS)})\.(?=\s?\d)",
    lambda lang, g, before, after: ("versus" if g("ab_vs") else NUMBER_MARK_WORDS[g("ab_page")]
                                    if g("ab_page") else _read_abbreviation(lang, g, before, after)),
    lang="en")
"""``p.``, ``pp.``, ``Art.`` and ``Para.`` are pages, articles and paragraphs only before a number
(p. 12, pp. 45-67, Art. 12): never in ``p.m.`` nor for the word Art at a sentence's end."""


_STREETS: Final = {"St": "Street", "Ave": "Avenue", "Rd": "Road", "Blvd": "Boulevard", "Dr": "Drive", "Ln": "Lane",
                   "Ct": "Court", "Pl": "Place", "Hwy": "Highway", "Pkwy": "Parkway", "Sq": "Square"}
"""The last word of a street's name as addresses abbreviate it without a dot."""
_TWO_WAY: Final = ("St", "Dr", "Ct", "Pl", "Sq")
"""Street abbreviations that are also another word's (St Louis, Dr Smith): a street's only with an
address around them."""
_ADDRESS_UNITS: Final = {"Apt": "Apartment", "Ste": "Suite", "Bldg": "Building", "ext": "extension",
                         "Ext": "extension", "EXT": "extension"}
"""Abbreviations before a number in an address or a phone number (Apt 4, Ste 200, ext 204)."""
_HOUSE_NUMBER_BEFORE: Final = re.compile(r"\b\d+[A-Z]?(?:\s+[A-Z][a-z]+){1,3}\s+$")
_ADDRESS_GOES_ON: Final = re.compile(r"\s*(?:[,;]|$|\n|(?:Apt|Suite|Ste|Unit|Bldg|Fl|Floor)\b|#)")


def _read_address_abbreviation(lang: Lang, g: Groups, before: str, after: str) -> str:
    """An address's abbreviations written without a dot: 12 Main Ave, Apt 4 -> Avenue,
    Apartment; Ste 200 -> Suite; ext 204 -> extension; PO Box -> P O Box. A street word counts
    after a capitalised name; St, Dr and the like only with a house number before the name
    (12 Main St) or a comma, the end or a flat after it (Elm St, Apt 4): Ask Dr Smith and St
    Louis stay as written."""
    if g("aa_po"):
        return "P O"
    if g("aa_unit"):
        return _ADDRESS_UNITS[g("aa_unit")]
    abbr = g("aa_street")
    if not re.search(r"\b[A-Z][a-z]+\s$", before):
        return abbr  # after no name (go to the St): no street
    if abbr not in _TWO_WAY or _HOUSE_NUMBER_BEFORE.search(before) or _ADDRESS_GOES_ON.match(after):
        return _STREETS[abbr]
    return abbr


ADDRESS_ABBREVIATION: Final = Kind(
    "address_abbreviation",
    rf"(?<=[a-z] )(?P<aa_street>{alt_words(_STREETS)})(?![A-Za-z.'’-])"
    rf"|(?<![A-Za-z.])(?:(?P<aa_unit>{alt_words(_ADDRESS_UNITS)})(?=\s?#?\d)|(?P<aa_po>P\.?O\.?)(?=\s+Box\b))",
    _read_address_abbreviation, lang="en", first=r"[A-Za-z]")
"""Where the abbreviation has its dot it is the abbreviation kind's (Main St., Apt. 4)."""


ROMAN_NUMERAL: Final = Kind(
    "roman_numeral",
    r"(?P<rm_uni>[\u2160-\u217f]+)"
    rf"|(?=[A-Z])(?<![A-Za-z])(?P<rm_word>(?:{alt_words(ROMAN_AFTER_WORDS + REGNAL_NAMES)})\s+)(?P<rm_num>[IVXLCDM]+)"
    r"(?![A-Za-z])"
    rf"|(?=[IVX])(?<![A-Za-z])(?P<rm_zh>[IVX]{{1,4}})(?=[{ROMAN_COUNTERS_ZH}])|(?=[IVXLC])(?<=第)(?P<rm_zh2>[IVXLC]+)(?![A-Za-z])",
    _read_roman_numeral)


def _read_section(lang: Lang, g: Groups, before: str, after: str) -> str:
    """§5 -> section five / 第五节, §§ 5-7 -> sections; the sign is never left unread."""
    num, many = g("sec_num"), g("sec_sign") == "§§"
    if lang == "zh":
        return "第" + zh_number(num) + "节"
    return ("sections " if many else "section ") + " point ".join(en_int(int(p)) for p in num.split("."))


SECTION: Final = Kind(
    "section",
    r"(?P<sec_sign>§§?)\s?(?P<sec_num>\d+(?:\.\d+)?)(?![\d.]|\.\d)",
    _read_section, first="§")


DOSE_FREQUENCIES: Final = {abbr: (zh, en) for abbr, zh, en in rows("dose_frequencies")}
"""How often a dose is taken, as prescriptions abbreviate it (bid: 每日两次 / twice a day)."""
DOSE_BEFORE: Final = words("dose_before")
"""Written right before bid, tid, ... (one space between), they make it a dose's frequency (1 tablet bid,
500mg tid); bid alone is a word."""
_DOSE_LEAD: Final = "|".join(f"(?<={re.escape(w)} )" for w in DOSE_BEFORE)
_DOSE_FIRST: Final = "[" + "".join(sorted({c for a in ("q", *DOSE_FREQUENCIES) for c in (a[0], a[0].upper())})) + "]"
"""The scanner's guard: without it the lead's lookbehinds were tried at every position of every text."""


def _read_dose_frequency(lang: Lang, g: Groups, before: str, after: str) -> str:
    """q8h -> 每八小时一次 / every eight hours; bid after a dose -> 每日两次 / twice a day."""
    if g("q_hours"):
        h = g("q_hours")
        return f"每{zh_number(h)}小时一次" if lang == "zh" else f"every {en_int(int(h))} hours"
    zh, en = DOSE_FREQUENCIES[g("q_abbr").lower()]
    return zh if lang == "zh" else en


DOSE_FREQUENCY: Final = Kind(
    "dose_frequency",
    r"(?<![A-Za-z0-9])[qQ](?P<q_hours>\d{1,2})[hH](?![A-Za-z0-9])"
    rf"|(?:{_DOSE_LEAD})(?P<q_abbr>{alt_words([*DOSE_FREQUENCIES, *(a.upper() for a in DOSE_FREQUENCIES)])})"
    r"(?![A-Za-z0-9])",
    _read_dose_frequency, first=_DOSE_FIRST)
"""Where the Chinese of a prescription writes q8h, bid, it is read in Chinese: 每八小时一次."""


# --- English contractions whose letters alone are another word ----------------------------

_CONTRACTION_WORDS: Final = {"re": "are", "ll": "will", "ve": "have", "m": "am"}
_HAD_NEXT: Final = re.compile(r"\s+(?:been|better|had|done|gone|seen|known|got|gotten|made|taken|given|said|told|left|"
                              r"heard|come|become|begun|written|spoken|eaten|forgotten|[a-z]+ed)\b", re.IGNORECASE)
"""A word after 'd that makes it had (I'd been, she'd left, we'd better), not would."""
_S_PRONOUNS: Final = ("he", "she", "who", "here", "where")
"""Words whose 's the apostrophe's loss misreads (hes, shes, whos, heres): read is or has. Other
's (it's, that's, the dog's) read alike without the apostrophe and keep it dropped."""
_HAS_NEXT: Final = re.compile(r"\s+(?:been|got|gotten|had|done|gone|seen|made|taken|given|[a-z]+ed)\b", re.IGNORECASE)


def _read_contraction(lang: Lang, g: Groups, before: str, after: str) -> str:
    """We're, he'll, I'd, I'm, you've, he's: the word and its verb in full (we are, he will, I
    would or had), where the letters without the apostrophe are another word (were, hell, Id)
    that ChatTTS would read."""
    word = g("ct_word") or g("ct_i") or g("ct_s_word")
    tail = (g("ct_tail") or g("ct_m") or g("ct_s")).lower()
    if tail == "d":
        verb = "had" if _HAD_NEXT.match(after) else "would"
    elif tail == "s":
        verb = "has" if _HAS_NEXT.match(after) else "is"
    else:
        verb = _CONTRACTION_WORDS[tail]
    return f"{word} {verb.upper() if word.isupper() and len(word) > 1 else verb}"


CONTRACTION: Final = Kind(
    "contraction",
    r"(?=[A-Za-z])(?<![A-Za-z'’])"
    r"(?:(?P<ct_word>[A-Za-z]+)['’](?P<ct_tail>re|ll|ve|d|RE|LL|VE|D)"
    r"|(?P<ct_i>[Ii])['’](?P<ct_m>m)"
    rf"|(?P<ct_s_word>(?i:{'|'.join(_S_PRONOUNS)}))['’](?P<ct_s>s))(?![A-Za-z'’])",
    _read_contraction, lang="en", first=r"[A-Za-z]")
"""The apostrophe is no character ChatTTS reads (its own normaliser drops it too): we're would
be were, he'll hell, she'd shed, I'm Im."""


# --- abbreviations written with a slash ------------------------------------------------

_SLASHED: Final = {"w/o": "without", "w/": "with", "c/o": "care of", "n/a": "not applicable", "a/c": "account"}
"""Abbreviations whose slash stands for missing letters (w/ milk, w/o sugar, c/o the hotel, n/a,
a/c no. 12): their word, never the letters one by one."""


def _read_slash_abbreviation(lang: Lang, g: Groups, before: str, after: str) -> str:
    """w/ milk -> with milk, w/o sugar -> without sugar, c/o -> care of, N/A -> not applicable,
    a/c before a number -> account; a 35 y/o man -> year old (before the noun it describes),
    he is 35 y/o -> years old."""
    if g("sl_yo"):
        return "year old" if re.match(r"\s+[a-z]", after) and not re.match(r"\s+(?:and|or|but)\b", after) \
            else "years old"
    return _SLASHED[g("sl_abbr").lower()]


SLASH_ABBREVIATION: Final = Kind(
    "slash_abbreviation",
    r"(?<![A-Za-z/])(?:(?P<sl_abbr>[wW]/[oO](?![A-Za-z/])|[wW]/(?=\s[A-Za-z]|[a-z]{2})|[cC]/[oO](?=\s)"
    r"|[nN]/[aA](?![A-Za-z/])|[aA]/[cC](?=\s?(?:[Nn]o\b|number\b|#|\d)))"
    r"|(?<=\d )(?P<sl_yo>[yY]/[oO])(?![A-Za-z/]))",
    _read_slash_abbreviation, lang="en", first=r"[wWcCnNaAyY]")
"""A slash inside another pair of letters (I/O, A/B, P/E) stays a name's, read as the letters."""
