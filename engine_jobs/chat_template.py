"""Chat messages -> one prompt string, with the tokenizer's own chat template, as ``transformers`` renders it.

With ``transformers`` installed (the serving image) its ``apply_chat_template`` renders. Without it
(slim images, CPU tests) the template is rendered with jinja2 the way transformers does
(transformers ``utils/chat_template_utils.py``: ``_compile_jinja_template`` / ``render_jinja_template``):
an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols extension, a
``{% generation %}`` block, ``raise_exception``, ``strftime_now``, a ``tojson`` filter that does not
HTML-escape, and the tokenizer's special tokens (``bos_token``, ``eos_token``, ...) as variables
(renders compared equal with transformers 4.53.1's ``apply_chat_template``).
The template comes from ``chat_template.jinja`` or ``tokenizer_config.json`` (``chat_template``: a
string, or a list of named templates of which ``default`` is used).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:  # jinja2 is the serving image's, imported where a template is compiled
    from jinja2 import Template
    from jinja2.parser import Parser

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class NoChatTemplate(ValueError):
    """The model's tokenizer has no chat template (chat requests cannot be rendered)."""


class ChatTemplateError(ValueError):
    """The template refused the conversation (``raise_exception``) or failed to render."""


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or a serialized AddedToken."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(content := value.get("content"), str):
        return content
    return None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def load_template(tokenizer_dir: str | Path) -> tuple[str | None, dict[str, Any]]:
    """(template source or None, special-token variables) of a Hugging Face tokenizer directory."""
    path = Path(tokenizer_dir)
    config = _read_json(path / CONFIG_FILE)
    tokens: dict[str, Any] = {k: t for k in _SPECIAL_KEYS if (t := _token_text(config.get(k))) is not None}
    for k, v in _read_json(path / SPECIAL_TOKENS_FILE).items():
        if k in _SPECIAL_KEYS and k not in tokens and (t := _token_text(v)) is not None:
            tokens[k] = t
    extra = config.get("additional_special_tokens") or []
    tokens["additional_special_tokens"] = [t for t in map(_token_text, extra) if t is not None]
    if (path / TEMPLATE_FILE).is_file():
        return (path / TEMPLATE_FILE).read_text(encoding="utf-8"), tokens
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: transformers uses "default" when none is asked for
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return (template if isinstance(template, str) and template else None), tokens


def _compile(source: str) -> Template:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body (transformers only tracks indices)."""

        tags = {"generation"}

        def parse(self, parser: Parser) -> nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    def raise_exception(message: str) -> NoReturn:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def strftime_now(fmt: str) -> str:
    """The template global transformers provides: the time now, formatted."""
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """Renders a conversation for one tokenizer directory (``hf``: its transformers tokenizer, if any)."""

    def __init__(self, tokenizer_dir: str | Path, hf: Any = None):
        self._hf = hf
        self.source, self.special_tokens = load_template(tokenizer_dir)
        if hf is not None and getattr(hf, "chat_template", None):
            self.source = hf.chat_template if isinstance(hf.chat_template, str) else self.source
        self._compiled: Template | None = None

    @property
    def available(self) -> bool:
        return bool(self.source) or (self._hf is not None and bool(getattr(self._hf, "chat_template", None)))

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        if not self.available:
            raise NoChatTemplate(
                "the model's tokenizer has no chat template (chat_template in "
                f"{CONFIG_FILE} or {TEMPLATE_FILE}); use /v1/completions"
            )
        try:
            if self._hf is not None:
                return str(
                    self._hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
                )
            if self._compiled is None:
                assert self.source is not None  # available
                self._compiled = _compile(self.source)
            return self._compiled.render(
                messages=messages,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except Exception as exc:  # TemplateError from raise_exception, or a template bug
            raise ChatTemplateError(f"chat template: {exc}") from exc
