# ruff: noqa: E501  (the templates are verbatim: their long lines are the families' own)
"""Chat templates of real reasoning-VLM families, for the tiny format models (benchmarks/tinyvlm/train_formats.py).

The templates are the families' own, copied verbatim as published with the models, because what the
proxy has to get right is what they render: Qwen3-VL-Thinking's `chat_template.json` (Qwen/Qwen3-VL-*-Thinking),
GLM-4.1V-9B-Thinking's `chat_template.jinja` (zai-org/GLM-4.1V-9B-Thinking) and Qwen2.5-VL-Instruct's
(which ThinkLite-VL keeps; `tinyvlm.tokenizer.CHAT_TEMPLATE`, the same text as Qwen2-VL-Instruct's).
tests/benchmarks/tinyvlm/test_chat_templates.py checks them against transcripts of what each renders.

Two derived ones:

- `GLM41V_THINKING_QWEN_VISION`: GLM's template with Qwen2.5-VL's image and video placeholders. The
  tiny models are Qwen2.5-VL underneath, whose processor expands `<|image_pad|>`; everything else
  (`[gMASK]<sop>`, the role tokens, the assistant turn as written) is GLM's.
- `QWEN3_VL_THINKING_CONTINUABLE`: Qwen3-VL-Thinking's template plus one branch: a final assistant
  message that opens a think block it does not close is rendered as written. The stock template
  re-wraps the last assistant turn as `<think>\n{reasoning}\n</think>\n\n{answer}`, so no partial message can
  leave the thinking open, and vLLM's `continue_final_message` is a boolean (transformers could continue
  the `reasoning_content` field instead). With this template vLLM can resume a chain inside its
  thinking (the `think_prompt` reasoning format); for every other message list it renders what the
  stock one does. docs/reasoning-models.md shows the branch for a real deployment (`--chat-template`).
"""

from __future__ import annotations

from faithproxy.benchmarks.tinyvlm.tokenizer import CHAT_TEMPLATE as QWEN25_VL

__all__ = [
    "GLM41V_THINKING",
    "GLM41V_THINKING_QWEN_VISION",
    "QWEN25_VL",
    "QWEN3_VL_THINKING",
    "QWEN3_VL_THINKING_CONTINUABLE",
]

# fmt: off
QWEN3_VL_THINKING = """\
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- macro render_content(content, do_vision_count) %}
    {%- if content is string %}
        {{- content }}
    {%- else %}
        {%- for item in content %}
            {%- if 'image' in item or 'image_url' in item or item.type == 'image' %}
                {%- if do_vision_count %}
                    {%- set image_count.value = image_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                <|vision_start|><|image_pad|><|vision_end|>
            {%- elif 'video' in item or item.type == 'video' %}
                {%- if do_vision_count %}
                    {%- set video_count.value = video_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                <|vision_start|><|video_pad|><|vision_end|>
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- render_content(messages[0].content, false) + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + render_content(messages[0].content, false) + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set content = render_content(message.content, false) %}
        {%- if not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = render_content(message.content, True) %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n<think>\\n' }}
{%- endif %}"""

GLM41V_THINKING = """\
[gMASK]<sop>
{%- for msg in messages %}
    {%- if msg.role == 'system' %}
<|system|>
{{ msg.content }}
    {%- elif msg.role == 'user' %}
<|user|>{{ '\\n' }}

        {%- if msg.content is string %}
{{ msg.content }}
        {%- else %}
            {%- for item in msg.content %}
                {%- if item.type == 'video' or 'video' in item %}
<|begin_of_video|><|video|><|end_of_video|>
                {%- elif item.type == 'image' or 'image' in item %}
<|begin_of_image|><|image|><|end_of_image|>
                {%- elif item.type == 'text' %}
{{ item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
    {%- elif msg.role == 'assistant' %}
        {%- if msg.metadata %}
<|assistant|>{{ msg.metadata }}
{{ msg.content }}
        {%- else %}
<|assistant|>
{{ msg.content }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{% if add_generation_prompt %}<|assistant|>
{% endif %}"""
# fmt: on

QWEN3_VL_THINKING_CONTINUABLE = QWEN3_VL_THINKING.replace(
    """        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}""",
    """        {%- if loop.last and not add_generation_prompt and '<think>' in content and '</think>' not in content %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- elif loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}""",
)
GLM41V_THINKING_QWEN_VISION = GLM41V_THINKING.replace(
    "<|begin_of_image|><|image|><|end_of_image|>", "<|vision_start|><|image_pad|><|vision_end|>"
).replace("<|begin_of_video|><|video|><|end_of_video|>", "<|vision_start|><|video_pad|><|vision_end|>")
