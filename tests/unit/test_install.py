"""cluster.install: the GPU install adds the published V0 prior's dependency (the ``v0`` extra,
tabpfn) and checks that it imports; the CPU install does not. pip and the import check are
recorded, not run."""
from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from cluster import install

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def recorded(monkeypatch):
    calls = {"pip": [], "run": []}
    monkeypatch.setattr(install, "pip", lambda *args: calls["pip"].append(args))
    monkeypatch.setattr(install.subprocess, "run",
                        lambda cmd, **kw: calls["run"].append(cmd) or SimpleNamespace(returncode=0))
    return calls


def _extras(calls) -> set[str]:
    [spec] = [a[-1] for a in calls["pip"] if "-e" in a]
    return set(spec[spec.index("[") + 1:-1].split(","))


def test_the_v0_extra_is_tabpfn():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(d.startswith("tabpfn") for d in extras["v0"])


def test_gpu_install_adds_the_v0_prior_and_checks_it_imports(recorded):
    assert install.main(["--gpu", "--no-chromium", "--no-build"]) == 0
    assert _extras(recorded) == {"cuda", "dev", "prior", "v0"}
    [check] = [c for c in recorded["run"] if c[1] == "-c"]
    assert check[2].endswith(", tabpfn") and "vllm" in check[2]
    assert not any("uninstall" in a for a in recorded["pip"])  # CUDA torch keeps torchvision


def test_cpu_install_has_no_v0_prior(recorded):
    assert install.main(["--no-chromium", "--no-build"]) == 0
    assert _extras(recorded) == {"cpu", "dev", "prior"}
    [check] = [c for c in recorded["run"] if c[1] == "-c"]
    assert "tabpfn" not in check[2]
    assert any("uninstall" in a for a in recorded["pip"])
