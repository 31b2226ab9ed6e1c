"""The chat template a gateway renders tool calls with, when the model's own template has none.

A template that never mentions `tool_calls` (SmolLM2's) would drop an assistant turn's calls (its
content is null) and never show the model the tools. `with_tool_rendering` puts a prelude before such a
template that rewrites the messages, then lets the model's template render them as usual:

- `tools` become a system message (appended to the first one if the chat starts with one) listing each
  function's JSON and the call format;
- an assistant turn's `tool_calls` become its content, the JSON array the tools' constraint emits,
  `[{"name":...,"parameters":{...}}]`, compact as generated (after any text the turn had);
- `role: "tool"` results keep their content (the model's template renders the role as it is).

NOTE: a chat with no tools and no tool calls renders exactly as with the model's template alone.
"""

from __future__ import annotations

TOOL_CALL_FORMAT = (
    'To call functions, answer with a JSON array only: [{"name":"<function name>","parameters":'
    "{<arguments>}}]. The functions:"
)

_PRELUDE = (
    "{%- set ns = namespace(msgs=[], rest=messages, listing='', text='') -%}"
    "{%- if tools -%}"
    "{%- set ns.listing = '" + TOOL_CALL_FORMAT + "' -%}"
    "{%- for t in tools -%}"
    "{%- set ns.listing = ns.listing ~ '\\n' ~ ((t.function if t.function is defined else t) | tojson) -%}"
    "{%- endfor -%}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set ns.msgs = [{'role': 'system', 'content': messages[0].content ~ '\\n\\n' ~ ns.listing}] -%}"
    "{%- set ns.rest = messages[1:] -%}"
    "{%- else -%}"
    "{%- set ns.msgs = [{'role': 'system', 'content': ns.listing}] -%}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{%- for m in ns.rest -%}"
    "{%- if m.tool_calls -%}"
    "{%- set ns.text = '' -%}"
    "{%- for tc in m.tool_calls -%}"
    "{%- set f = tc.function if tc.function is defined else tc -%}"
    "{%- set args = f.arguments if f.arguments is string else (f.arguments | tojson) -%}"
    "{%- set ns.text = ns.text ~ (',' if not loop.first else '') ~ '{\"name\":' ~ (f.name | tojson)"
    " ~ ',\"parameters\":' ~ args ~ '}' -%}"
    "{%- endfor -%}"
    "{%- set lead = (m.content ~ '\\n') if m.content else '' -%}"
    "{%- set ns.msgs = ns.msgs + [{'role': m.role, 'content': lead ~ '[' ~ ns.text ~ ']'}] -%}"
    "{%- else -%}"
    "{%- set ns.msgs = ns.msgs + [m] -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- set messages = ns.msgs %}"
)


def with_tool_rendering(template: str) -> str:
    """`template` itself when it renders tool calls, else the prelude above followed by it."""
    if "tool_calls" in template:
        return template
    return _PRELUDE + template
