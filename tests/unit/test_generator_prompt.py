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


def test_a_datasets_conversation_keeps_its_turns(chat_tok):
    """A dataset prompt with a system turn (Problem.messages) reaches the template as turns;
    the configured system prompt does not stack on the dataset's own; without a template the
    text (the contents joined) is what the model reads."""
    turns = (("system", "Reply with a number."), ("user", "12+3="))
    ids = render_prompt(chat_tok, "Reply with a number.\n\n12+3=", "auto", messages=turns)
    assert chat_tok.decode(ids) == "<system>Reply with a number.</s><user>12+3=</s><assistant>"
    ids = render_prompt(chat_tok, "x", "chat", system="Be brief.", messages=turns)
    assert chat_tok.decode(ids).count("<system>") == 1 and "Be brief." not in chat_tok.decode(ids)
    two_users = (("user", "a"), ("assistant", "b"), ("user", "c"))
    ids = render_prompt(chat_tok, "a\n\nb\n\nc", "chat", system="Be brief.", messages=two_users)
    assert chat_tok.decode(ids) == ("<system>Be brief.</s><user>a</s><assistant>b</s><user>c</s>"
                                    "<assistant>")
    assert render_prompt(build_tokenizer(), "a\n\nb", "auto", messages=two_users[:2]) == "a\n\nb"
