"""Reading a completion's final answer and grading it, the ways verl and OpenRLHF users' models
write it and their graders read it. Three graders (``task.grading``; per ``data_source`` with
``task.grading_by_source``):

- ``default``: the final answer is the LAST of the markers a model writes, wherever it is:
  ``\\boxed{...}`` (or ``\\fbox``), an ``Answer: ...`` line (also ``Final Answer:``,
  ``**Final Answer**: ...``), a GSM8K ``#### ...`` line, "The (final) answer is ...", and
  ``<answer>...</answer>``; one written inside another (``Answer: \\boxed{5}``) is the inner
  one. It is compared with the ground truth by ``math_verify`` (1/2, 0.5 and \\frac{1}{2}
  agree; intervals, sets, percentages), after a number followed only by words ("72 clips",
  "18 dollars") is taken as the number.
- ``strict``: verl's ``math_dapo`` rule, for curves comparable with a verl DAPO run: only the
  last ``Answer:`` line of the completion's last 300 characters, normalized as Minerva's
  evaluation does (the text after the last "=", units and spaces removed, ``\\text{..}``,
  ``\\boxed{..}`` and ``$`` unwrapped, ``\\frac12`` written out, thousands separators
  dropped), equal to the normalized ground truth as a string.
- ``flexible``: the last number written anywhere (verl's GSM8K "flexible" extraction), for
  small models that ignore a format instruction; compared as a number.

Pure Python and ``re``; ``math_verify`` is imported on first use.
"""
from __future__ import annotations

import re
import threading
from functools import lru_cache

GRADERS = ("default", "strict", "flexible")

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
# "Answer: 5", "Final Answer: 5", "**Answer:** 5", "**Final Answer**: 5" (to the line's end)
_ANSWER_LINE = re.compile(r"answer\s*(?:\*\*)?\s*:\s*(?:\*\*)?\s*([^\n]+)", re.IGNORECASE)
_HASHES = re.compile(r"^[ \t]*####[ \t]*([^\n]+)", re.MULTILINE)  # GSM8K
_ANSWER_IS = re.compile(r"the\s+(?:final\s+)?answer\s+is\s*:?\s*([^\n]+?)\s*(?:\.(?:\s|$)|\n|$)",
                        re.IGNORECASE)
_TAGS = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.IGNORECASE | re.DOTALL)
_NUMBER_WORDS = re.compile(r"^\s*(-?\$?\s*\d[\d,]*(?:\.\d+)?\s*\\?%?)\s+([A-Za-z][A-Za-z .]*)$")
_LAST_NUMBER = re.compile(r"-?[$0-9.,]{2,}|-?[0-9]+")  # GSM8K's flexible extraction
_STRICT_LINE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
STRICT_TAIL = 300  # math_dapo reads the completion's last 300 characters


def balanced_after(text: str, start: int) -> tuple[str, int] | None:
    """The content of the brace group opening just before ``start`` and where it ends."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i], i + 1
    return None


def markers(text: str) -> list[tuple[int, int, str]]:
    """Every final-answer marker in ``text``: (start, end, answer), in order of start."""
    found = []
    for m in _BOXED.finditer(text):
        inside = balanced_after(text, m.end())
        if inside is not None:
            found.append((m.start(), inside[1], inside[0]))
    for pattern in (_ANSWER_LINE, _HASHES, _ANSWER_IS, _TAGS):
        found += [(m.start(), m.end(), m.group(1)) for m in pattern.finditer(text)]
    return sorted(found)


def clean(answer: str) -> str | None:
    """An answer as written, bare: bold marks, math delimiters and a closing period gone."""
    a = answer.strip().strip("*").strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(a) > len(left) + len(right) and a.startswith(left) and a.endswith(right):
            a = a[len(left):-len(right)].strip()
    a = a.rstrip(".").strip().strip("*").strip()
    return a or None


def extract_default(completion: str) -> str | None:
    """The last marker's answer (``default``); one marker inside another: the inner one."""
    found = markers(completion)
    if not found:
        return None
    start, end, answer = found[-1]
    inner = [f for f in found if f[0] >= start and f[1] <= end and f != found[-1]]
    return clean(inner[-1][2] if inner else answer)


def without_units(answer: str) -> str:
    """"72 clips" -> "72": a number followed only by words is the number."""
    m = _NUMBER_WORDS.match(answer)
    return m[1].replace("$", "").strip() if m else answer


def _timeout() -> int | None:
    # math_verify's timeouts use SIGALRM, which only the main thread may install.
    return 5 if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=65536)
def _parse(text: str) -> tuple:
    """math_verify parse of a bare answer; tried as LaTeX math first, then as plain text."""
    from math_verify import parse

    # no_fallback: text math_verify cannot interpret yields [] instead of the raw string.
    kw = dict(fallback_mode="no_fallback", parsing_timeout=_timeout())
    return tuple(parse(f"${text}$", **kw) or parse(text, **kw))


def answers_match(gold: str, answer: str) -> bool | None:
    """math_verify equivalence (a number with units read as the number); None when
    ``answer`` cannot be parsed."""
    from math_verify import verify

    pred = _parse(without_units(answer))
    if not pred:
        return None
    ref = _parse(gold)
    if not ref:  # an unparseable ground truth (free text): fall back to exact text
        return " ".join(gold.split()) == " ".join(answer.split())
    return bool(verify(list(ref), list(pred), timeout_seconds=_timeout()))


# -- strict: verl's math_dapo (Minerva's normalization) -----------------------------------
# The words and rewrites are Minerva's published answer normalization (Lewkowycz et al.,
# 2022, appendix), which verl's math_dapo applies: the same lists, or the strings differ.
_UNIT_WORDS = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km",
               "units", "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents",
               "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
               "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
               "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ",
               r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots")
_REWRITES = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""),
             ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","),
             ("\\text{m}", "\\text{}"))
_UNWRAP = [re.compile(r"\\" + cmd + r"\{(.*?)\}") for cmd in ("text", "textbf", "overline")]


def minerva_normalize(answer: str) -> str:
    """A final answer normalized the way Minerva's MATH evaluation (and verl's math_dapo)
    does, so that strings compare: see the module docstring."""
    a = answer.split("=")[-1]
    for old, new in _REWRITES:
        a = a.replace(old, new)
    for word in _UNIT_WORDS:
        a = a.replace(word, "")
    m = re.search(r"\$(.*?)\$", a)
    if m:
        a = f"${m[1]}$"
    for pattern in _UNWRAP:
        a = pattern.sub(r"\1", a)
    a = re.sub(r"\\boxed\{(.*)\}", r"\1", a)
    a = re.sub(r"frac([^{])(.)", r"frac{\1}{\2}", a)
    a = re.sub(r"sqrt([^{])", r"sqrt{\1}", a)
    a = a.replace("$", "")
    if a.replace(",", "").isdigit():
        a = a.replace(",", "")
    return a.strip()


def extract_strict(completion: str) -> str | None:
    lines = _STRICT_LINE.findall(completion[-STRICT_TAIL:])
    return lines[-1] if lines else None


def strict_match(gold: str, answer: str) -> bool:
    return minerva_normalize(answer) == minerva_normalize(gold)


# -- flexible: the last number --------------------------------------------------------------
def extract_flexible(completion: str) -> str | None:
    for m in reversed(_LAST_NUMBER.findall(completion)):
        n = m.replace("$", "").replace(",", "").rstrip(".")
        if re.fullmatch(r"-?\d+(?:\.\d+)?", n):
            return n
    return None


def number_match(gold: str, answer: str) -> bool | None:
    try:
        g = float(without_units(gold).replace(",", "").replace("$", ""))
    except ValueError:
        return answers_match(gold, answer)
    return abs(float(answer) - g) <= 1e-9 * max(1.0, abs(g))


class Grader:
    """One way of reading and grading a final answer (module docstring): ``extract``
    (completion -> answer or None) and ``is_correct`` (gold, answer -> bool, None when the
    answer cannot be interpreted)."""

    def __init__(self, name: str):
        if name not in GRADERS:
            raise ValueError(f"unknown grader {name!r}; valid: {', '.join(GRADERS)}")
        self.name = name
        self.extract = {"default": extract_default, "strict": extract_strict,
                        "flexible": extract_flexible}[name]
        self.is_correct = {"default": answers_match, "strict": strict_match,
                           "flexible": number_match}[name]

    @property
    def answer_format(self) -> str:
        return {"default": "the last of \\boxed{...}, an 'Answer: ...' line, '#### ...', "
                           "'The answer is ...' and <answer>...</answer>",
                "strict": "the last 'Answer: ...' line of the last 300 characters (verl's "
                          "math_dapo)",
                "flexible": "the last number written"}[self.name]
