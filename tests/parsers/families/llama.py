"""Fixture model folders for the Llama 3/4, Granite and Nemotron parser families (no hub).

Each folder is the Qwen3 example folder (render_service.model.example) with the family's markers
appended as added tokens, flagged special as the real tokenizers flag them (so each marker has its
own id and `skip_special_tokens` drops the special ones), a chat template written here that emits
the family's format, and the family's eos ids. `build_family(dir, name)` writes one folder.

Families:
- `llama3`: `<|begin_of_text|>`, `<|start_header_id|>`/`<|end_header_id|>`, `<|eot_id|>`,
  `<|eom_id|>`, `<|python_tag|>` (all special, as in Llama 3.1); tools shown as JSON in the user
  turn; assistant calls rendered as `<|python_tag|>{"name": ..., "parameters": ...}`.
- `llama4`: `<|header_start|>`/`<|header_end|>`, `<|eot|>`, `<|eom|>`, `<|python_start|>`,
  `<|python_end|>` (special, as in Llama 4); assistant calls rendered pythonic
  (`[get_weather(city='Paris')]`).
- `granite`: `<|start_of_role|>`/`<|end_of_role|>`, `<|end_of_text|>`, `<|tool_call|>` (special,
  as in Granite 3.x); `thinking=true` asks for "Here is my thought process: ... Here is my
  response: ...". Granite 4's `<tool_call>...</tool_call>` reuse Qwen's `<tool_call>` tokens.
- `nemotron`: the Qwen3 vocabulary (ChatML, `<think>`/`</think>`) with a Nemotron-3-style template
  (`enable_thinking=false` renders `<think></think>`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from render_service.model.example import build_qwen3

FIRST_EXTRA_ID = 151669  # right after Qwen3's `</think>`

# name -> (added tokens in id order as (content, special), eos token names)
MARKERS: dict[str, tuple[list[tuple[str, bool]], list[str]]] = {
    "llama3": (
        [
            ("<|begin_of_text|>", True),
            ("<|end_of_text|>", True),
            ("<|start_header_id|>", True),
            ("<|end_header_id|>", True),
            ("<|eom_id|>", True),
            ("<|eot_id|>", True),
            ("<|python_tag|>", True),
        ],
        ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"],
    ),
    "llama4": (
        [
            ("<|begin_of_text|>", True),
            ("<|end_of_text|>", True),
            ("<|header_start|>", True),
            ("<|header_end|>", True),
            ("<|eom|>", True),
            ("<|eot|>", True),
            ("<|python_start|>", True),
            ("<|python_end|>", True),
            ("<|python_tag|>", True),  # vLLM's llama4_json (Llama3JsonToolParser) requires it
        ],
        ["<|eot|>", "<|eom|>", "<|end_of_text|>"],
    ),
    "granite": (
        [
            ("<|start_of_role|>", True),
            ("<|end_of_role|>", True),
            ("<|end_of_text|>", True),
            ("<|tool_call|>", True),
        ],
        ["<|end_of_text|>"],
    ),
    "nemotron": ([], ["<|im_end|>"]),
}

TEMPLATES: dict[str, str] = {}

TEMPLATES["llama3"] = r"""{{- bos_token }}
{%- set date_string = date_string if date_string is defined else "26 Jul 2024" %}
{%- if messages[0].role == 'system' %}
    {%- set system_message = messages[0].content %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Cutting Knowledge Date: December 2023\nToday Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools %}
    {%- if messages and messages[0].role == 'user' %}
        {%- set first_user = messages[0].content %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {%- set first_user = "" %}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' }}
    {{- "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.\n\n' }}
    {%- for t in tools %}
        {{- t | tojson }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user + "<|eot_id|>" }}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}{% set content = message.content %}{% else %}{% set content = '' %}{% endif %}
    {%- if message.role == 'assistant' and message.tool_calls %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n<|python_tag|>' }}
        {%- for tool_call in message.tool_calls %}
            {%- set f = tool_call.function if tool_call.function else tool_call %}
            {%- if not loop.first %}{{- '; ' }}{% endif %}
            {{- '{"name": "' + f.name + '", "parameters": ' }}
            {%- if f.arguments is string %}{{- f.arguments }}{% else %}{{- f.arguments | tojson }}{% endif %}
            {{- "}" }}
        {%- endfor %}
        {{- "<|eom_id|>" }}
    {%- elif message.role == 'tool' or message.role == 'ipython' %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" + content + "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + content | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

TEMPLATES["llama4"] = r"""{{- bos_token }}
{%- if messages[0].role == 'system' %}
    {%- set system_message = messages[0].content %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{%- if tools or system_message %}
    {{- "<|header_start|>system<|header_end|>\n\n" + system_message }}
    {%- if tools %}
        {{- "\n\nYou can call these functions. To call them, reply with a python list of calls, e.g. [func(a=1, b='x')], optionally wrapped in <|python_start|> and <|python_end|>.\n" }}
        {%- for t in tools %}
            {{- t | tojson }}
            {{- "\n" }}
        {%- endfor %}
    {%- endif %}
    {{- "<|eot|>" }}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}{% set content = message.content %}{% else %}{% set content = '' %}{% endif %}
    {%- if message.role == 'assistant' and message.tool_calls %}
        {{- '<|header_start|>assistant<|header_end|>\n\n' + content + '[' }}
        {%- for tool_call in message.tool_calls %}
            {%- set f = tool_call.function if tool_call.function else tool_call %}
            {%- if not loop.first %}{{- ', ' }}{% endif %}
            {{- f.name + '(' }}
            {%- set args = f.arguments if f.arguments is mapping else {} %}
            {%- for k, v in args.items() %}
                {%- if not loop.first %}{{- ', ' }}{% endif %}
                {{- k + '=' + v | tojson }}
            {%- endfor %}
            {{- ')' }}
        {%- endfor %}
        {{- ']<|eot|>' }}
    {%- elif message.role == 'tool' or message.role == 'ipython' %}
        {{- "<|header_start|>ipython<|header_end|>\n\n" + content + "<|eot|>" }}
    {%- else %}
        {{- '<|header_start|>' + message.role + '<|header_end|>\n\n' + content | trim + '<|eot|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|header_start|>assistant<|header_end|>\n\n' }}
{%- endif %}
"""

TEMPLATES["granite"] = r"""{%- if messages[0].role == 'system' %}
    {%- set system_message = messages[0].content %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = "Knowledge Cutoff Date: April 2024.\nYou are Granite, developed by IBM." %}
    {%- if tools %}
        {%- set system_message = system_message + " You are a helpful AI assistant with access to the following tools. When a tool is required to answer the user's query, respond with <|tool_call|> followed by a JSON list of tools used." %}
    {%- endif %}
    {%- if thinking is defined and thinking %}
        {%- set system_message = system_message + " Respond to every user query in a comprehensive and detailed way. You can write down your thoughts and reasoning process before responding. In the thought process, engage in a comprehensive cycle of analysis. Write your thoughts after 'Here is my thought process:' and write your response after 'Here is my response:' for each user query." %}
    {%- endif %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '<|start_of_role|>system<|end_of_role|>' + system_message + '<|end_of_text|>\n' }}
{%- if tools %}
    {{- '<|start_of_role|>available_tools<|end_of_role|>' }}
    {{- tools | tojson(indent=4) }}
    {{- '<|end_of_text|>\n' }}
{%- endif %}
{%- for message in loop_messages %}
    {%- if message.content is string %}{% set content = message.content %}{% else %}{% set content = '' %}{% endif %}
    {%- if message.role == 'assistant' and message.tool_calls %}
        {{- '<|start_of_role|>assistant<|end_of_role|>' + content + '<|tool_call|>[' }}
        {%- for tool_call in message.tool_calls %}
            {%- set f = tool_call.function if tool_call.function else tool_call %}
            {%- if not loop.first %}{{- ', ' }}{% endif %}
            {{- '{"name": "' + f.name + '", "arguments": ' }}
            {%- if f.arguments is string %}{{- f.arguments }}{% else %}{{- f.arguments | tojson }}{% endif %}
            {{- '}' }}
        {%- endfor %}
        {{- ']<|end_of_text|>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|start_of_role|>tool_response<|end_of_role|>' + content + '<|end_of_text|>\n' }}
    {%- else %}
        {{- '<|start_of_role|>' + message.role + '<|end_of_role|>' + content + '<|end_of_text|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_of_role|>assistant<|end_of_role|>' }}
{%- endif %}
"""

TEMPLATES["nemotron"] = r"""{%- set enable_thinking = enable_thinking if enable_thinking is defined else true %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content }}{% set loop_messages = messages[1:] %}{% else %}{% set loop_messages = messages %}{% endif %}
{%- if tools %}
    {{- "\n\n# Tools\n\nYou have access to the following functions:\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" + tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nTo call a function, reply with <tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>" }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- for message in loop_messages %}
    {%- if message.content is string %}{% set content = message.content %}{% else %}{% set content = '' %}{% endif %}
    {%- if message.role == 'assistant' %}
        {%- set reasoning = message.reasoning_content if message.reasoning_content is string else (message.reasoning if message.reasoning is string else '') %}
        {{- '<|im_start|>assistant\n<think>' + reasoning + '</think>' + content }}
        {%- for tool_call in message.tool_calls or [] %}
            {%- set f = tool_call.function if tool_call.function else tool_call %}
            {{- '\n<tool_call>\n{"name": "' + f.name + '", "arguments": ' }}
            {%- if f.arguments is string %}{{- f.arguments }}{% else %}{{- f.arguments | tojson }}{% endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + content + '\n</tool_response><|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking %}{{- '<think>\n' }}{% else %}{{- '<think></think>' }}{% endif %}
{%- endif %}
"""

SERVED_NAMES = {"llama3": "tinyllama3", "llama4": "tinyllama4", "granite": "tinygranite", "nemotron": "tinynemotron"}


def family_ids(name: str) -> dict[str, int]:
    """Marker -> id for a family (the extra markers only)."""
    added, _ = MARKERS[name]
    return {content: FIRST_EXTRA_ID + i for i, (content, _special) in enumerate(added)}


def build_family(target: str | Path, name: str) -> Path:
    """Write the fixture folder of family `name` at `target` and return its path."""
    path = Path(target)
    path.mkdir(parents=True, exist_ok=True)
    build_qwen3(path)
    added, eos_names = MARKERS[name]
    tokenizer_json = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    ids = {tok["content"]: tok["id"] for tok in tokenizer_json["added_tokens"]}
    for i, (content, special) in enumerate(added):
        token_id = FIRST_EXTRA_ID + i
        entry = {
            "id": token_id,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": special,
        }
        tokenizer_json["added_tokens"].append(entry)
        config["added_tokens_decoder"][str(token_id)] = {k: v for k, v in entry.items() if k != "id"}
        ids[content] = token_id
    (path / "tokenizer.json").write_text(json.dumps(tokenizer_json, ensure_ascii=False), encoding="utf-8")
    config["chat_template"] = TEMPLATES[name]
    config["eos_token"] = eos_names[0]
    if name in ("llama3", "llama4"):
        config["bos_token"] = "<|begin_of_text|>"
    _write_json(path / "tokenizer_config.json", config)
    model_config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    model_config["eos_token_id"] = ids[eos_names[0]]
    model_config["vocab_size"] = max(model_config["vocab_size"], FIRST_EXTRA_ID + len(added))
    _write_json(path / "config.json", model_config)
    generation = json.loads((path / "generation_config.json").read_text(encoding="utf-8"))
    generation["eos_token_id"] = [ids[n] for n in eos_names]
    _write_json(path / "generation_config.json", generation)
    return path


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0] or None)
    parser.add_argument("dir")
    parser.add_argument("family")
    options = parser.parse_args()
    print(build_family(options.dir, options.family))
