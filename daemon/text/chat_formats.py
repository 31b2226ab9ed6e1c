"""Chat templates for files that carry none, by architecture (a GGUF's `general.architecture`).

Gemma's GGUFs often ship without `tokenizer.chat_template`; its turn format is fixed: `<start_of_turn>`
ROLE, newline, the text trimmed, `<end_of_turn>`, newline, with roles `user` and `model` and no system
role (a system message leads the next user turn). Tool results come back as user turns. The template
writes BOS itself.
"""

from __future__ import annotations

_GEMMA_TURNS = (
    "{{ bos_token }}{% set ns = namespace(lead='') %}"
    "{% for m in messages %}"
    "{% set text = (m['content'] if m['content'] is string else"
    " (m['content'] or []) | selectattr('type', 'equalto', 'text') | map(attribute='text') | join(''))"
    " | trim %}"
    "{% if m['role'] == 'system' %}{% set ns.lead = ns.lead + text + '\n\n' %}"
    "{% elif m['role'] in ('user', 'tool') %}"
    "<start_of_turn>user\n{{ ns.lead }}{{ text }}<end_of_turn>\n{% set ns.lead = '' %}"
    "{% elif m['role'] == 'assistant' %}<start_of_turn>model\n{{ text }}<end_of_turn>\n"
    "{% else %}{{ raise_exception('unknown chat role ' + m['role']) }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

_BY_ARCHITECTURE = {"gemma": _GEMMA_TURNS, "gemma2": _GEMMA_TURNS, "gemma3": _GEMMA_TURNS}


def fallback_chat_template(architecture: str | None) -> str | None:
    """The fixed turn format of `architecture` where it has one, else None."""
    return _BY_ARCHITECTURE.get(architecture or "")
