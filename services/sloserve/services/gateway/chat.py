"""Chat messages -> prompt text with the model's chat template (as vLLM and HF do).

The template is the model's own Jinja (``tokenizer.chat_template`` in its GGUF, or
``chat_template`` in its ``tokenizer_config.json``), shipped by the executor in
``ExecutorDescription.chat_template``. A backend with no model (``sim``) has none:
the fallback is ChatML, SmolLM2's own format, so a chat sent to the simulator looks
like one sent to the real model. Rendering runs in Jinja's immutable sandbox.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from sloserve.services.gateway.validate import InvalidInput

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ROLES = ("system", "user", "assistant", "tool", "developer")
MAX_MESSAGES = 1024


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise InvalidInput(f"messages: {message}")

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def check_messages(messages: Sequence[tuple[str, str]]) -> None:
    if not messages:
        raise InvalidInput("messages: must not be empty")
    if len(messages) > MAX_MESSAGES:
        raise InvalidInput(f"messages: {len(messages)} messages, at most {MAX_MESSAGES}")
    for k, (role, _) in enumerate(messages):
        if role not in ROLES:
            raise InvalidInput(f"messages[{k}].role: must be one of {', '.join(ROLES)}, "
                               f"got {role!r}")


def render(messages: Sequence[tuple[str, str]], template: str = "", bos_token: str = "",
           eos_token: str = "", tools: list[Any] | None = None,
           add_generation_prompt: bool = True, continue_final_message: bool = False) -> str:
    """The prompt for ``messages`` ((role, content) pairs), ending with the assistant's turn;
    ``tools``: the template's ``tools`` (OpenAI's tool objects, as vLLM passes them);
    ``continue_final_message``: end inside the last message instead (HF's rule)."""
    check_messages(messages)
    if continue_final_message and add_generation_prompt:  # as transformers refuses it
        raise InvalidInput("continue_final_message: needs add_generation_prompt false")
    try:
        text: str = _compile(template or CHATML).render(
            messages=[{"role": r, "content": c} for r, c in messages], tools=tools,
            add_generation_prompt=add_generation_prompt, bos_token=bos_token,
            eos_token=eos_token)
    except jinja2.TemplateError as exc:
        raise InvalidInput(f"messages: the chat template failed: {exc}") from None
    return continue_final(text, messages[-1][1]) if continue_final_message else text


def continue_final(rendered: str, final: str) -> str:
    """``rendered`` cut right after the final message's content, so the model continues it
    (transformers' ``apply_chat_template(continue_final_message=True)``, which vLLM uses)."""
    stripped = final.strip()
    at = rendered.rfind(stripped)
    if not stripped or at < 0:
        raise InvalidInput("continue_final_message: the final message is not in the "
                           "rendered chat (an empty or template-rewritten message)")
    if rendered[at:at + len(final.lstrip())] == final:
        return rendered[:at + len(final.lstrip())]
    return rendered[:at + len(stripped)]
