"""What the tiny format models say: one chain world written in the output format of each reasoning family.

The fixture model (benchmarks/tinyvlm/fixture_spec.py) answers in one fixed shape with a plain ChatML template. The
format models share one set of weights trained on the same images and sentences, served from one model
directory per family, each with that family's real chat template (benchmarks/tinyvlm/chat_templates.py). Which
format the model writes is told by the prompt it sees, as with the real models:

- `qwen3` (Qwen3-VL-Thinking): the generation prompt ends with `<think>\\n`; the model writes
  `{thinking}\\n</think>\\n\\n{answer}`; vLLM `--reasoning-parser qwen3`;
- `glm` (GLM-4.1V-Thinking): `<think>{thinking}</think><answer>{answer}</answer>`, ended by
  `<|user|>` like GLM (an end-of-sequence token in its generation config); `--reasoning-parser glm45`
  and `--chat-template-content-format string`: GLM's template prints an assistant message's content
  as it comes, and in vLLM's default ("openai") content format that is a list of parts, so the
  assistant text of a continuation (or of any earlier turn) would reach the model as a Python list;
- `plain` (Qwen2.5-VL / ThinkLite-VL): `{thinking}\\n\\n{answer}`, no markers, no parser.

Three questions (fixture images): `red_circle` plants a wrong perception sentence in the thinking,
`square_and_circle` one in the answer, `green_circle` has none. For each planted sentence the model
is also trained on the reflect regenerator's prompt (its rewrite, in the family's format) and on the
continuation the proxy sends after the rewrite, in the family's continuation shape
(faithcore/reasoning_formats.py): for `qwen3` the stock template closes the think block after the
accepted text, so the model answers from there; with the continuable template (`think_prompt`, the
same generation prompt) it resumes its thinking; GLM's and Qwen2.5-VL's templates render the accepted
text as written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from faithproxy.benchmarks.tinyvlm import chat_templates as templates
from faithproxy.benchmarks.tinyvlm import fixture_spec as spec
from faithproxy.benchmarks.tinyvlm.examples import question_messages, user_message
from faithproxy.faithcore.reasoning_formats import get_format
from faithproxy.faithcore.types import Channel
from faithproxy.regenerators.prompts import build_regeneration_prompt

THOUGHT = "I look at the image again."  # what the thinking models think before a rewrite


@dataclass(frozen=True)
class Family:
    """A served model directory: its template, how vLLM must serve it and the proxy's format name."""

    name: str  # the model directory's name and the model name vLLM serves
    template: str
    parser: str | None  # vLLM's --reasoning-parser
    reasoning_format: str  # the proxy's (faithcore.reasoning_formats)
    end_token: str  # what the model writes after its answer (an end-of-sequence token)
    content_format: str = "openai"  # vLLM's --chat-template-content-format

    def vllm_args(self) -> list[str]:
        args = ["--chat-template-content-format", self.content_format]
        return args + (["--reasoning-parser", self.parser] if self.parser else [])


FAMILIES: dict[str, Family] = {
    "qwen3": Family("qwen3-vl-thinking", templates.QWEN3_VL_THINKING, "qwen3", "qwen3", "<|im_end|>"),
    "glm": Family(
        "glm-4.1v-thinking", templates.GLM41V_THINKING_QWEN_VISION, "glm45", "think_answer", "<|user|>", "string"
    ),
    "plain": Family("qwen2.5-vl", templates.QWEN25_VL, None, "plain", "<|im_end|>"),
}


@dataclass(frozen=True)
class Chain:
    fixture: str
    thinking: tuple[str, ...]
    answer: tuple[str, ...]


@dataclass(frozen=True)
class Planted:
    """A wrong perception sentence, its rewrite, and the chain after the rewrite."""

    chain: Chain
    channel: Channel  # where it stands: the thinking or the answer
    index: int  # in that part
    rewrite: str
    thinking_after: tuple[str, ...]  # the rest of the thinking after the rewrite (thinking plants only)
    answer_after: tuple[str, ...]  # the answer after the rewrite, or after the thinking

    @property
    def sentence(self) -> str:
        part = self.chain.thinking if self.channel is Channel.REASONING else self.chain.answer
        return part[self.index]

    @property
    def prefix(self) -> list[str]:
        """The accepted sentences before it (the regeneration prompt's prefix)."""
        if self.channel is Channel.REASONING:
            return list(self.chain.thinking[: self.index])
        return [*self.chain.thinking, *self.chain.answer[: self.index]]


RED = Chain(
    "red_circle",
    (
        "The image shows one circle.",
        "It is near the left edge.",
        "The circle is blue.",
        "The question asks for the colour of the shape.",
        "Blue is option B.",
    ),
    ("The answer is B.",),
)
GREEN = Chain(
    "green_circle",
    (
        "The image shows one circle.",
        "It is near the left edge.",
        "The circle is green.",
        "The question asks for the colour of the shape.",
        "Green is option C.",
    ),
    ("The answer is C.",),
)
LEFT = Chain(
    "square_and_circle",
    (
        "The image shows two shapes.",
        "The square is red and the circle is blue.",
        "The question asks which shape is on the left.",
    ),
    ("The circle is on the left.", "So the answer is B."),
)
CHAINS = {c.fixture: c for c in (RED, GREEN, LEFT)}

IN_THINKING = Planted(
    RED,
    Channel.REASONING,
    2,
    "The circle is red.",
    ("The question asks for the colour of the shape.", "Red is option A."),
    ("The answer is A.",),
)
IN_ANSWER = Planted(LEFT, Channel.CONTENT, 0, "The square is on the left.", (), ("So the answer is A.",))
PLANTED = {p.chain.fixture: p for p in (IN_THINKING, IN_ANSWER)}


def oracle_json() -> dict[str, Any]:
    """The local judge's oracle: the planted sentences are unfaithful; conclusions are reasoning."""
    reasoning = {
        s
        for c in CHAINS.values()
        for s in (*c.thinking, *c.answer)
        if s.startswith(("The question", "So ", "The answer")) or " is option " in s
    }
    reasoning |= {s for p in PLANTED.values() for s in (*p.thinking_after, *p.answer_after)}
    return {"unfaithful": [p.sentence for p in PLANTED.values()], "reasoning": sorted(reasoning)}


# ---- the texts a family writes ------------------------------------------------------------------------


def output(family: str, thinking: list[str] | tuple[str, ...], answer: list[str] | tuple[str, ...]) -> str:
    """A whole reply (what the model writes after the generation prompt), without its end token."""
    t, a = " ".join(thinking), " ".join(answer)
    if family == "qwen3":
        return f"{t}\n</think>\n\n{a}"
    if family == "glm":
        return f"<think>{t}</think><answer>{a}</answer>"
    return f"{t}\n\n{a}"


def chain_output(family: str, chain: Chain) -> str:
    return output(family, chain.thinking, chain.answer)


def fields(family: str, text: str, parsed: bool) -> dict[str, str]:
    """The reply as vLLM hands it out: split by the family's reasoning parser, or all in `content`.

    The parsers drop the think markers (and nothing else: GLM's `<answer>` tags stay in the content);
    glm45 also drops the whitespace that ends the thinking (there is none in these chains).
    """
    if not parsed:
        return {"content": text}
    body = text.removeprefix("<think>")
    thinking, _, answer = body.partition("</think>")
    out = {"reasoning": thinking}
    if answer:
        out["content"] = answer
    return out


def corrected_output(family: str, planted: Planted, resumes: bool) -> str:
    """The reply once the proxy has rewritten the planted sentence (the model's own words after it).

    `resumes`: the continuation resumes inside the thinking (GLM, Qwen2.5-VL, `think_prompt`); with the
    stock Qwen3 template a rewrite in the thinking closes it, so the rest of the thinking is never written.
    """
    c = planted.chain
    if planted.channel is Channel.CONTENT:
        return output(family, c.thinking, [*c.answer[: planted.index], planted.rewrite, *planted.answer_after])
    head = [*c.thinking[: planted.index], planted.rewrite]
    thinking = [*head, *planted.thinking_after] if resumes else head
    return output(family, thinking, planted.answer_after)


def continuation_split(family: str, planted: Planted, resumes: bool) -> tuple[str, str]:
    """(the accepted text the proxy sends back, what the model writes after it), as the model sees them."""
    whole = corrected_output(family, planted, resumes)
    at = whole.index(planted.rewrite) + len(planted.rewrite)
    accepted, rest = whole[:at], whole[at:]
    if family == "qwen3" and planted.channel is Channel.REASONING and not resumes:
        accepted, rest = accepted + "\n</think>\n\n", rest.removeprefix("\n</think>\n\n")
    return accepted, rest


def partial_content(family: str, planted: Planted, resumes: bool) -> str:
    """The partial assistant message the proxy sends (faithcore.reasoning_formats), unparsed stream."""
    accepted, _ = continuation_split(family, planted, resumes)
    name = "think_prompt" if resumes and family == "qwen3" else FAMILIES[family].reasoning_format
    fmt = get_format(name)
    if family == "qwen3" and planted.channel is Channel.REASONING and not resumes:
        accepted = accepted.removesuffix("\n</think>\n\n")  # the format adds the close itself
    continuation = fmt.continuation({Channel.REASONING: "", Channel.CONTENT: accepted})
    return continuation.content


def regeneration_reply(family: str, planted: Planted) -> str:
    if family == "plain":
        return f"[{planted.rewrite}]"
    return output(family, [THOUGHT], [f"[{planted.rewrite}]"])


# ---- training examples ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FormatExample:
    key: str
    family: str
    template: str
    fixture: str
    messages: list[dict[str, Any]]
    target: str  # what the model writes, its end token excluded

    @property
    def end_token(self) -> str:
        return FAMILIES[self.family].end_token

    @property
    def content_format(self) -> str:
        return FAMILIES[self.family].content_format


def regeneration_messages(planted: Planted) -> list[dict[str, Any]]:
    question = spec.get(planted.chain.fixture).question
    prompt = build_regeneration_prompt(question, planted.prefix, planted.sentence)
    return [user_message(planted.chain.fixture, prompt)]


def family_examples(family: str) -> list[FormatExample]:
    template = FAMILIES[family].template
    out = []
    for chain in CHAINS.values():
        messages = question_messages(spec.get(chain.fixture))
        target = chain_output(family, chain)
        out.append(FormatExample(f"{family}/chain/{chain.fixture}", family, template, chain.fixture, messages, target))
    for planted in PLANTED.values():
        fixture = planted.chain.fixture
        out.append(
            FormatExample(
                f"{family}/regeneration/{fixture}",
                family,
                template,
                fixture,
                regeneration_messages(planted),
                regeneration_reply(family, planted),
            )
        )
        shapes = [(True, template)]
        if family == "qwen3":  # the stock template closes the thinking; the continuable one resumes it
            shapes = [(False, template)]
            if planted.channel is Channel.REASONING:
                shapes.append((True, templates.QWEN3_VL_THINKING_CONTINUABLE))
        for resumes, shape_template in shapes:
            partial = {"role": "assistant", "content": partial_content(family, planted, resumes)}
            messages = [*question_messages(spec.get(fixture)), partial]
            _, rest = continuation_split(family, planted, resumes)
            key = f"{family}/continuation/{fixture}" + ("/resumed" if resumes and family == "qwen3" else "")
            out.append(FormatExample(key, family, shape_template, fixture, messages, rest))
    return out


def all_examples() -> list[FormatExample]:
    return [e for family in FAMILIES for e in family_examples(family)]
