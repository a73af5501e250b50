"""Bad models and prompts fail before any actor starts, naming the problem."""
import pytest

from actors.generator import GeneratorConfig
from cluster.preflight import PreflightError, check_model, check_prompts
from tasks import ArithmeticTask
from tasks.base import Problem
from tasks.policy_model import build_tokenizer


class Fixed(ArithmeticTask):
    def __init__(self, train, heldout):
        super().__init__()
        self._tr, self._ho = train, heldout

    def train(self):
        return list(self._tr)

    def heldout(self):
        return list(self._ho)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tasks.policy_model import save_random_policy

    return str(save_random_policy(tmp_path_factory.mktemp("m"), hidden_size=32,
                                  intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=2))


def P(i, text):
    return Problem(id=f"p{i}", prompt=text, answer="0")


def test_a_directory_with_a_broken_config_is_not_a_model(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(PreflightError, match="not a usable model"):
        check_model(str(tmp_path))


def test_a_real_model_passes_and_prompts_are_measured(model_dir):
    check_model(model_dir)
    task = Fixed([P(0, "1+2="), P(1, "10+20=")], [P(2, "3+4=")])
    assert check_prompts(model_dir, task, GeneratorConfig(), max_tokens=8) == 6


def test_a_prompt_too_long_for_the_engine_is_named(model_dir):
    task = Fixed([P(0, "1+2="), P(7, "9" * 300)], [P(2, "3+4=")])
    with pytest.raises(PreflightError, match="'p7' has 300 tokens"):
        check_prompts(model_dir, task, GeneratorConfig(max_model_len=256), max_tokens=8)


def test_a_prompt_that_encodes_to_nothing_and_an_empty_split(model_dir):
    with pytest.raises(PreflightError, match="'p5'.*to no token"):
        check_prompts(model_dir, Fixed([P(5, "")], [P(2, "3+4=")]), GeneratorConfig(), 8)
    with pytest.raises(PreflightError, match="held-out split has no prompt"):
        check_prompts(model_dir, Fixed([P(0, "1+2=")], []), GeneratorConfig(), 8)


def test_chat_format_without_a_template_is_named(model_dir):
    task = Fixed([P(0, "1+2=")], [P(2, "3+4=")])
    with pytest.raises(PreflightError, match="cannot encode.*no chat template"):
        check_prompts(model_dir, task, GeneratorConfig(prompt_format="chat"), 8)
