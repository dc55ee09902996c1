"""A suggested findings/tico.toml record for each group of new problems (one message shape).

A new problem on another tico is red until someone diagnoses it; the record a diagnosis ends in
has the same parts each time, so the harness drafts them: an id and title from the message, the
checks it was seen on, and per check a pattern that matches every problem of the group and nothing
that differs in wording (numbers become number patterns, the rest is literal, matched against each
line's matchable form). The cause and the symbols are the diagnosis and stay for a person to write."""

from __future__ import annotations

import re
from typing import Any

from harness.model.expectations import matchable
from harness.tico_facts.finding_status import group_new_problems
from harness.tico_facts.findings_data import pattern_flaw

_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")
_NUMBER_PATTERN = r"-?[\d.]+(?:e[-+]?\d+)?"


def _literal(text: str) -> str:
    return re.escape(text).replace("\\ ", " ")


def pattern_for(line: str) -> str:
    """An anchored regex for ``line``'s matchable form with every number left free."""
    text = matchable(line)
    parts, last = [], 0
    for match in _NUMBER.finditer(text):
        parts.append(_literal(text[last : match.start()]))
        parts.append(_NUMBER_PATTERN)
        last = match.end()
    parts.append(_literal(text[last:]))
    return "^" + "".join(parts) + "$"


def _slug(text: str) -> str:
    words = re.findall(r"[a-z]+", _NUMBER.sub(" ", text.lower()))
    return "-".join(words[:6]) or "new-problem"


def suggest(group: list[dict[str, Any]]) -> str:
    """The TOML text of a suggested record for one group of new problems (``group_new_problems``)."""
    first = group[0]
    checks = sorted({p["where"].rsplit("::", 1)[-1] for p in group})
    patterns = {
        check: sorted({pattern_for(p["problem"]) for p in group if p["where"].endswith(f"::{check}")})
        for check in checks
    }
    title = _NUMBER.sub("N", matchable(first["problem"]))[:90]
    lines = [
        f"# seen on {len(group)} item(s), e.g. {first['where']}; diagnose it in tico's source and reproduce it first",
        "[[finding]]",
        f'id = "{_slug(matchable(first["problem"]))}"',
        f'title = "{title}"',
        "symbols = []  # the tico functions the diagnosis names",
        'cause = """',
        "What tico does, where (file and function), and why the check sees this; the reproduction's test.",
        '"""',
        "[finding.patterns]",
    ]
    for check, found in patterns.items():
        flaws = sorted({flaw for p in found if (flaw := pattern_flaw(p))})
        note = f"  # rewrite: the pattern names {', '.join(flaws)}" if flaws else ""
        literals = ", ".join(f"'''{p}'''" for p in found)  # TOML literal strings keep the regex as written
        lines.append(f"{check} = [{literals}]{note}")
    return "\n".join(lines)


def suggestions(new_problems: list[dict[str, Any]]) -> list[str]:
    return [suggest(group) for group in group_new_problems(new_problems)]
