"""A chat template in the manner of Qwen3-Coder's (and Qwen3.5's): tools listed as XML, calls
written and asked for as ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>``
blocks, a mapping or list argument as JSON and anything else as its text. Shortened from the
real one, which cannot be downloaded here; what the server reads from it (``<function=`` in the
source, tools rendered) is the same."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

QWEN3_CODER_TEMPLATE = """\
{%- if messages[0].role == 'system' %}
{%- set system_message = messages[0].content %}
{%- set loop_messages = messages[1:] %}
{%- else %}
{%- set loop_messages = messages %}
{%- endif %}
{%- if tools is iterable and tools | length > 0 %}
{{- '<|im_start|>system\\n' }}
{%- if system_message is defined %}{{- system_message + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' }}
{%- for tool in tools %}
{%- set tool = tool.function if tool.function is defined else tool %}
{{- '\\n<function>\\n<name>' ~ tool.name ~ '</name>\\n<parameters>' }}
{%- for name, spec in (tool.parameters.properties | default({})) | items %}
{{- '\\n<parameter>\\n<name>' ~ name ~ '</name>\\n<type>' ~ (spec.type | default('string')) ~ '</type>\\n</parameter>' }}
{%- endfor %}
{{- '\\n</parameters>\\n</function>' }}
{%- endfor %}
{{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:\\n\\n' }}
{{- '<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n' }}
{{- '</function>\\n</tool_call><|im_end|>\\n' }}
{%- elif system_message is defined %}
{{- '<|im_start|>system\\n' + system_message + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in loop_messages %}
{%- if message.role == 'assistant' and message.tool_calls is defined and message.tool_calls %}
{{- '<|im_start|>assistant\\n' + (message.content or '') }}
{%- for tool_call in message.tool_calls %}
{%- set tool_call = tool_call.function if tool_call.function is defined else tool_call %}
{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
{%- for name, value in tool_call.arguments | items %}
{%- set value = value | tojson if value is mapping or (value is sequence and value is not string) else value | string %}
{{- '<parameter=' + name + '>\\n' + value + '\\n</parameter>\\n' }}
{%- endfor %}
{{- '</function>\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def with_coder_template(checkpoint: Path, directory: Path) -> Path:
    """A copy of an HF checkpoint directory whose tokenizer_config carries the template above."""
    shutil.copytree(checkpoint, directory, dirs_exist_ok=True)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps(config | {"chat_template": QWEN3_CODER_TEMPLATE}, indent=1))
    return directory
