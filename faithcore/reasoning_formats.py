"""Reasoning formats: where a model writes its chain of thought, and how a cut chain is continued.

A reasoning VLM writes its thinking and its answer in one output, told apart by markers, and vLLM may
split them into the `reasoning` and `content` fields with a reasoning parser (which drops the think
markers) or pass everything in `content`. The proxy continues a chain after a corrected step by sending
the accepted text back as a partial assistant message (`continue_final_message`), which the model's
chat template renders. Three things differ between families and decide how that is done:

- who opens the think block: the model (DeepSeek-R1 style, GLM-4.1V) or the chat template's
  generation prompt (Qwen3 thinking templates end with `<|im_start|>assistant\\n<think>\\n`), so that
  the model's first token is already inside it and its output never contains the opening marker;
- what else marks the output (GLM-4.1V puts its answer in `<answer>...</answer>`);
- how the template renders a final assistant message: as written (Qwen2.5-VL, GLM-4.1V), or split at
  the think close marker and re-wrapped as `<think>\\n{reasoning}\\n</think>\\n\\n{answer}` (Qwen3's
  templates, which therefore cannot leave a think block open: a partial message cut inside the
  thinking comes back closed, and vLLM's `continue_final_message` is a plain boolean, so the
  template's reasoning field cannot be the one continued).

The invariant a continuation keeps, whatever the format: the prompt vLLM renders for it is the first
round's prompt followed by exactly the text the model wrote and the proxy accepted (markers included),
so that the model continues what it sees as its own output. When the template cannot render the
accepted text that way (Qwen3, cut inside the thinking), the proxy closes the think block the way the
template would ("bridge" text, sent to the client as if the model had written it) and the model goes
on with its answer.

Pure: no I/O. The server picks a format from its settings or a request header (server/admission/policy.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from faithproxy.faithcore.types import Channel

__all__ = ["FORMATS", "Continuation", "ReasoningFormat", "get_format"]


@dataclass(frozen=True)
class Continuation:
    """How to continue after the accepted text.

    `bridge`: text per channel that the rendered prompt holds after the accepted text although the model
    did not write it (the think block closed by the template); it goes to the client and into the
    accepted text as if the model had written it. `content`: the partial assistant message's content.
    `in_answer`: the next round starts after the think block, so all its text is answer text, whatever
    field a reasoning parser puts it in (one that starts every stream inside the thinking would say
    `reasoning`).
    """

    content: str
    in_answer: bool
    bridge: Mapping[Channel, str]


@dataclass(frozen=True)
class ReasoningFormat:
    """One family's output markers and chat-template behaviour (see the module docstring)."""

    name: str
    description: str
    thinks: bool = True  # the model writes a think block at all
    think_open: str = "<think>"
    think_close: str = "</think>"
    prompt_opens_think: bool = False  # the generation prompt ends with `think_open` + "\n"
    answer_open: str | None = None  # GLM-4.1V: "<answer>"
    answer_close: str | None = None
    # The template re-renders the final assistant message as `<think>\n{r}\n</think>\n\n{a}` (Qwen3).
    rewraps_final_message: bool = False

    def with_tags(self, think_open: str, think_close: str) -> ReasoningFormat:
        """The same format with other think markers (Kimi-VL's `◁think▷` ... `◁/think▷`)."""
        return replace(self, think_open=think_open, think_close=think_close)

    @property
    def tags(self) -> tuple[str, ...]:
        """Markers that bound steps and are never part of a step's text."""
        tags = (self.think_open, self.think_close)
        if self.answer_open and self.answer_close:
            tags += (self.answer_open, self.answer_close)
        return tags

    def model_text(self, accepted: Mapping[Channel, str]) -> str:
        """The accepted text as the model wrote it after the generation prompt, markers included.

        Text in the reasoning channel came through a reasoning parser, which dropped the think markers:
        they are put back (the opening one only when the model writes it itself).
        """
        reasoning, content = accepted.get(Channel.REASONING, ""), accepted.get(Channel.CONTENT, "")
        if not reasoning:
            return content
        opening = "" if self.prompt_opens_think else self.think_open
        return opening + reasoning + (self.think_close + content if content else "")

    def in_answer(self, text: str) -> bool:
        """Whether the model's output `text` has left its think block (or never had one)."""
        if not self.thinks:
            return True
        opened = 0 if self.prompt_opens_think else text.rfind(self.think_open)
        if opened < 0:
            return True  # the model did not think: everything is its answer
        return text.find(self.think_close, opened) >= 0

    def continuation(self, accepted: Mapping[Channel, str]) -> Continuation:
        text = self.model_text(accepted)
        bridge: dict[Channel, str] = {}
        if self.rewraps_final_message and not self.in_answer(text):
            # The template would close the think block anyway (`{r}\n</think>\n\n`): close it here in the
            # same words, so that what the model sees is what the proxy accepted and the client gets.
            # A newline the model wrote after its last step is already there (the template strips it
            # and puts its own back: the model sees one either way).
            before, after = ("" if text.endswith("\n") else "\n"), "\n\n"
            if accepted.get(Channel.REASONING):  # parsed: vLLM would split the two sides of the marker
                bridge = {Channel.REASONING: before, Channel.CONTENT: after} if before else {Channel.CONTENT: after}
            else:
                bridge = {Channel.CONTENT: before + self.think_close + after}
            text += before + self.think_close + after
        prefix = self.think_open + "\n" if self.prompt_opens_think and not self.rewraps_final_message else ""
        return Continuation(content=prefix + text, in_answer=self.in_answer(text), bridge=bridge)


_FORMATS = (
    ReasoningFormat(
        "think",
        "the model writes <think>...</think> itself; the template renders assistant text as written "
        "(DeepSeek-R1 style, Kimi-VL with its own markers)",
    ),
    ReasoningFormat(
        "plain", "no think markers: the whole output is the answer (Qwen2.5-VL, ThinkLite-VL)", thinks=False
    ),
    ReasoningFormat(
        "think_answer",
        "<think>...</think><answer>...</answer>, written by the model (GLM-4.1V-Thinking)",
        answer_open="<answer>",
        answer_close="</answer>",
    ),
    ReasoningFormat(
        "qwen3",
        "the generation prompt opens <think>; the template re-renders the last assistant turn with a closed "
        "think block (Qwen3-VL-Thinking): a chain cut inside the thinking is continued after it",
        prompt_opens_think=True,
        rewraps_final_message=True,
    ),
    ReasoningFormat(
        "think_prompt",
        "the generation prompt opens <think>; the template renders a final assistant message as written "
        "(a Qwen3 thinking template with the continuation branch, see docs/reasoning-models.md)",
        prompt_opens_think=True,
    ),
)
FORMATS: dict[str, ReasoningFormat] = {f.name: f for f in _FORMATS}


def get_format(name: str, think_open: str = "<think>", think_close: str = "</think>") -> ReasoningFormat:
    """The format called `name`, with the given think markers; KeyError names the known ones."""
    try:
        fmt = FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown reasoning format {name!r}; known: {', '.join(FORMATS)}") from None
    if (think_open, think_close) != (fmt.think_open, fmt.think_close):
        fmt = fmt.with_tags(think_open, think_close)
    return fmt
