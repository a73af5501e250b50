"""How a task prompt reaches the engine: raw text, or the chat template's token ids."""
import pytest

from actors.engine_config import GeneratorConfig
from actors.generator import render_prompt
from tasks.policy_model import build_tokenizer

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def chat_tok():
    tok = build_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def test_raw_prompts_go_as_text():
    tok = build_tokenizer()  # no chat template
    assert render_prompt(tok, "12+3=", "auto") == "12+3="
    assert render_prompt(tok, "12+3=", "raw") == "12+3="
    with pytest.raises(ValueError, match="no chat template"):
        render_prompt(tok, "12+3=", "chat")


def test_chat_prompts_are_the_templates_token_ids(chat_tok):
    ids = render_prompt(chat_tok, "12+3=", "auto")
    assert ids == chat_tok("<user>12+3=</s><assistant>", add_special_tokens=False)["input_ids"]
    assert render_prompt(chat_tok, "12+3=", "raw") == "12+3="
    with_system = render_prompt(chat_tok, "12+3=", "chat", system="Be brief.")
    assert chat_tok.decode(with_system) == "<system>Be brief.</s><user>12+3=</s><assistant>"


def test_config_validates_the_format():
    assert GeneratorConfig().prompt_format == "auto"
    with pytest.raises(ValueError):
        GeneratorConfig(prompt_format="jinja")
