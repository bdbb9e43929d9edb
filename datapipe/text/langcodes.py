"""The language codes the langid stage can output, and suggestions for codes it cannot.

A keep list with a code the model never outputs (``chinese``, ``EN``, ``zh-CN``) silently drops
every document as ``language_not_kept``, so pipeline validation checks codes against this list.
It is the label set of fastText lid.176 (``__label__`` stripped), shipped as a constant so a
pipeline validates without loading or fetching the model; ``tests/pipeline/test_validate_resources.py``
checks it against the model file. English names come from CLDR (via babel, when this list was
written) and from Wikipedia for the codes CLDR lacks.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

LID176_NAMES: dict[str, str] = {
    "af": "Afrikaans",
    "als": "Alemannic",
    "am": "Amharic",
    "an": "Aragonese",
    "ar": "Arabic",
    "arz": "Egyptian Arabic",
    "as": "Assamese",
    "ast": "Asturian",
    "av": "Avaric",
    "az": "Azerbaijani",
    "azb": "South Azerbaijani",
    "ba": "Bashkir",
    "bar": "Bavarian",
    "bcl": "Central Bikol",
    "be": "Belarusian",
    "bg": "Bulgarian",
    "bh": "Bihari",
    "bn": "Bangla",
    "bo": "Tibetan",
    "bpy": "Bishnupriya",
    "br": "Breton",
    "bs": "Bosnian",
    "bxr": "Russia Buriat",
    "ca": "Catalan",
    "cbk": "Chavacano",
    "ce": "Chechen",
    "ceb": "Cebuano",
    "ckb": "Central Kurdish",
    "co": "Corsican",
    "cs": "Czech",
    "cv": "Chuvash",
    "cy": "Welsh",
    "da": "Danish",
    "de": "German",
    "diq": "Zazaki",
    "dsb": "Lower Sorbian",
    "dty": "Doteli",
    "dv": "Divehi",
    "el": "Greek",
    "eml": "Emilian-Romagnol",
    "en": "English",
    "eo": "Esperanto",
    "es": "Spanish",
    "et": "Estonian",
    "eu": "Basque",
    "fa": "Persian",
    "fi": "Finnish",
    "fr": "French",
    "frr": "Northern Frisian",
    "fy": "Western Frisian",
    "ga": "Irish",
    "gd": "Scottish Gaelic",
    "gl": "Galician",
    "gn": "Guarani",
    "gom": "Goan Konkani",
    "gu": "Gujarati",
    "gv": "Manx",
    "he": "Hebrew",
    "hi": "Hindi",
    "hif": "Fiji Hindi",
    "hr": "Croatian",
    "hsb": "Upper Sorbian",
    "ht": "Haitian Creole",
    "hu": "Hungarian",
    "hy": "Armenian",
    "ia": "Interlingua",
    "id": "Indonesian",
    "ie": "Interlingue",
    "ilo": "Iloko",
    "io": "Ido",
    "is": "Icelandic",
    "it": "Italian",
    "ja": "Japanese",
    "jbo": "Lojban",
    "jv": "Javanese",
    "ka": "Georgian",
    "kk": "Kazakh",
    "km": "Khmer",
    "kn": "Kannada",
    "ko": "Korean",
    "krc": "Karachay-Balkar",
    "ku": "Kurdish",
    "kv": "Komi",
    "kw": "Cornish",
    "ky": "Kyrgyz",
    "la": "Latin",
    "lb": "Luxembourgish",
    "lez": "Lezghian",
    "li": "Limburgish",
    "lmo": "Lombard",
    "lo": "Lao",
    "lrc": "Northern Luri",
    "lt": "Lithuanian",
    "lv": "Latvian",
    "mai": "Maithili",
    "mg": "Malagasy",
    "mhr": "Eastern Mari",
    "min": "Minangkabau",
    "mk": "Macedonian",
    "ml": "Malayalam",
    "mn": "Mongolian",
    "mr": "Marathi",
    "mrj": "Western Mari",
    "ms": "Malay",
    "mt": "Maltese",
    "mwl": "Mirandese",
    "my": "Burmese",
    "myv": "Erzya",
    "mzn": "Mazanderani",
    "nah": "Nahuatl",
    "nap": "Neapolitan",
    "nds": "Low German",
    "ne": "Nepali",
    "new": "Newari",
    "nl": "Dutch",
    "nn": "Norwegian Nynorsk",
    "no": "Norwegian",
    "oc": "Occitan",
    "or": "Odia",
    "os": "Ossetic",
    "pa": "Punjabi",
    "pam": "Pampanga",
    "pfl": "Palatine German",
    "pl": "Polish",
    "pms": "Piedmontese",
    "pnb": "Western Panjabi",
    "ps": "Pashto",
    "pt": "Portuguese",
    "qu": "Quechua",
    "rm": "Romansh",
    "ro": "Romanian",
    "ru": "Russian",
    "rue": "Rusyn",
    "sa": "Sanskrit",
    "sah": "Yakut",
    "sc": "Sardinian",
    "scn": "Sicilian",
    "sco": "Scots",
    "sd": "Sindhi",
    "sh": "Serbo-Croatian",
    "si": "Sinhala",
    "sk": "Slovak",
    "sl": "Slovenian",
    "so": "Somali",
    "sq": "Albanian",
    "sr": "Serbian",
    "su": "Sundanese",
    "sv": "Swedish",
    "sw": "Swahili",
    "ta": "Tamil",
    "te": "Telugu",
    "tg": "Tajik",
    "th": "Thai",
    "tk": "Turkmen",
    "tl": "Tagalog",
    "tr": "Turkish",
    "tt": "Tatar",
    "tyv": "Tuvinian",
    "ug": "Uyghur",
    "uk": "Ukrainian",
    "ur": "Urdu",
    "uz": "Uzbek",
    "vec": "Venetian",
    "vep": "Veps",
    "vi": "Vietnamese",
    "vls": "West Flemish",
    "vo": "Volapük",
    "wa": "Walloon",
    "war": "Waray",
    "wuu": "Wu Chinese",
    "xal": "Kalmyk",
    "xmf": "Mingrelian",
    "yi": "Yiddish",
    "yo": "Yoruba",
    "yue": "Cantonese",
    "zh": "Chinese",
}
LID176_CODES: frozenset[str] = frozenset(LID176_NAMES)

# Other spellings people write for the codes above: ISO 639-2/3 codes, retired ISO 639-1
# codes, and names that are not the CLDR name.
ALIASES: dict[str, str] = {
    "zho": "zh",
    "chi": "zh",
    "cmn": "zh",
    "mandarin": "zh",
    "simplified chinese": "zh",
    "traditional chinese": "zh",
    "eng": "en",
    "jpn": "ja",
    "kor": "ko",
    "fra": "fr",
    "fre": "fr",
    "deu": "de",
    "ger": "de",
    "spa": "es",
    "rus": "ru",
    "ara": "ar",
    "vie": "vi",
    "por": "pt",
    "ita": "it",
    "tha": "th",
    "ind": "id",
    "hin": "hi",
    "farsi": "fa",
    "persian": "fa",
    "tagalog": "tl",
    "filipino": "tl",
    "iw": "he",
    "in": "id",
    "ji": "yi",
    "jw": "jv",
    "nb": "no",
    "bokmal": "no",
    "norwegian bokmal": "no",
    "cantonese chinese": "yue",
    # Country codes written for the language (cn is not a language code; difflib alone would
    # offer scn, Sicilian). Only countries with one clear language, and only codes lid.176 lacks.
    "cn": "zh",
    "tw": "zh",
    "jp": "ja",
    "kr": "ko",
    "gr": "el",
    "cz": "cs",
    "dk": "da",
    "se": "sv",
    "ua": "uk",
    "vn": "vi",
    "il": "he",
    "ee": "et",
    "gb": "en",
    "us": "en",
}

# Region and script subtags of Chinese: lid.176 has one code for all of them, and the langid
# stage's script signal tells Traditional from Simplified.
_ZH_SUBTAGS = frozenset({"cn", "tw", "hk", "mo", "sg", "hans", "hant"})


def suggest_language(value: str, codes: Iterable[str] = LID176_CODES) -> str | None:
    """The code most likely meant by ``value`` (``chinese`` -> zh, ``zh-CN`` -> zh), or None."""
    codes = set(codes)
    v = value.strip().lower().replace("_", "-")
    if v in codes:
        return v  # a case slip: EN -> en
    if ALIASES.get(v) in codes:
        return ALIASES[v]
    base = v.split("-")[0]
    if base in codes:
        return base  # a region or script subtag: zh-cn, zh-hans, en-us
    by_name = {name.lower(): code for code, name in LID176_NAMES.items() if code in codes}
    if v in by_name:
        return by_name[v]
    close = difflib.get_close_matches(v, [*by_name, *codes, *ALIASES], n=1, cutoff=0.75)
    if close:
        c = close[0]
        return by_name.get(c) or ALIASES.get(c) or c
    return None


def language_problems(
    values: Iterable[str], codes: Iterable[str] = LID176_CODES, model: str = "lid.176"
) -> list[tuple[int, str]]:
    """(index, message) for each value the model never outputs, with a 'did you mean' where one fits."""
    codes = set(codes)
    out = []
    for i, value in enumerate(values):
        if value in codes:
            continue
        hint = suggest_language(value, codes)
        name = f" ({LID176_NAMES[hint]})" if hint in LID176_NAMES else ""
        tip = f"; did you mean {hint!r}{name}?" if hint else " (codes are ISO 639 like zh, en, ja, yue)"
        subtags = value.lower().replace("_", "-").split("-")[1:]
        if hint in ("zh", "yue") and _ZH_SUBTAGS.intersection(subtags):
            tip += f" ({hint} is Traditional and Simplified alike; langid's script column, hant or hans, tells them apart)"
        out.append((i, f"{value!r} is not a language code of the {model} model{tip}"))
    return out
