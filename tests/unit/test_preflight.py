"""Bad models and prompts fail before any actor starts, naming the problem."""
import pytest

from actors.engine_config import GeneratorConfig
from cluster.config.preflight import PreflightError, check_model, check_prompts
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


def copy_without(src, dst, *names):
    import shutil

    shutil.copytree(src, dst, ignore=lambda d, files: [f for f in files if f in names])
    return str(dst)


def test_a_model_without_weights_is_named(model_dir, tmp_path):
    bare = copy_without(model_dir, tmp_path / "bare", "model.safetensors")
    with pytest.raises(PreflightError, match=r"bare: not a usable model \(no weights: none of "
                                             r"model.safetensors"):
        check_model(bare)


def test_a_sharded_model_with_a_shard_missing_is_named(model_dir, tmp_path):
    import json

    part = copy_without(model_dir, tmp_path / "part", "model.safetensors")
    names = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    (tmp_path / "part" / names[0]).write_bytes(b"")
    (tmp_path / "part" / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {f"w{i}": n for i, n in enumerate(names)}}))
    with pytest.raises(PreflightError, match=r"2 of the 3 weight shards that model.safetensors"
                                             r".index.json names are missing: model-00002"):
        check_model(part)


def test_a_model_without_a_tokenizer_is_named(model_dir, tmp_path):
    notok = copy_without(model_dir, tmp_path / "notok", "tokenizer.json",
                         "tokenizer_config.json", "special_tokens_map.json")
    with pytest.raises(PreflightError, match=r"notok: not a usable model \(no tokenizer: none "
                                             r"of tokenizer.json"):
        check_model(notok)


def test_characters_the_tokenizer_maps_to_unknown_are_named(model_dir):
    # The embedded character tokenizer knows printable ASCII only.
    task = Fixed([P(0, "1+2="), P(3, "Löse x² = 4 für x")], [P(2, "3+4=")])
    with pytest.raises(PreflightError, match=r"cannot encode train prompt 'p3' \('Löse.*'ö', "
                                             r"'²', 'ü' map to the unknown token '<unk>'"):
        check_prompts(model_dir, task, GeneratorConfig(), 8)


@pytest.mark.parametrize("archs, why", [
    (["NoSuchModelForCausalLM"], r"architecture NoSuchModelForCausalLM is not one the installed "
                                 r"vLLM generates with"),
    (None, r"config.json names no architecture"),
])
def test_an_architecture_vllm_cannot_serve_is_named(model_dir, tmp_path, archs, why):
    import json

    odd = copy_without(model_dir, tmp_path / "odd")
    config = json.loads((tmp_path / "odd" / "config.json").read_text())
    if archs is None:
        del config["architectures"]
    else:
        config["architectures"] = archs
    (tmp_path / "odd" / "config.json").write_text(json.dumps(config))
    with pytest.raises(PreflightError, match=rf"odd: not a usable model \({why}"):
        check_model(odd)


def test_vllm_registry_is_read_without_importing_vllm():
    import sys

    from cluster.config.preflight import vllm_architectures

    before = "vllm.model_executor.models.registry" in sys.modules
    vllm_architectures.cache_clear()
    known = vllm_architectures()
    assert {"LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen2ForCausalLM"} <= known
    assert "BertModel" not in known  # an encoder is no policy
    assert ("vllm.model_executor.models.registry" in sys.modules) == before
