"""cluster.install's Chromium step (for the report's browser test): installed with apt only
when missing and when root with apt-get; never fails the install."""
from __future__ import annotations

from types import SimpleNamespace

from cluster import install


def fake_env(monkeypatch, *, have: set[str], root: bool, apt_rc: int = 0, raises: bool = False):
    calls: list[list[str]] = []

    def run(cmd, env=None, check=False):
        calls.append(cmd)
        assert env["DEBIAN_FRONTEND"] == "noninteractive" and not check
        if raises:
            raise OSError("apt-get: exec failed")
        if apt_rc == 0 and cmd[:2] == ["apt-get", "install"]:
            have.add("chromium")
        return SimpleNamespace(returncode=apt_rc)

    monkeypatch.setattr(install.shutil, "which",
                        lambda name: f"/usr/bin/{name}" if name in have else None)
    monkeypatch.setattr(install.os, "geteuid", lambda: 0 if root else 1000)
    monkeypatch.setattr(install.subprocess, "run", run)
    return calls


def test_present_chromium_is_left_alone(monkeypatch):
    calls = fake_env(monkeypatch, have={"chromium", "apt-get"}, root=True)
    assert install.install_chromium() and calls == []


def test_installed_with_apt_as_root(monkeypatch):
    calls = fake_env(monkeypatch, have={"apt-get"}, root=True)
    assert install.install_chromium()
    assert calls == [["apt-get", "install", "-y", "-q", "chromium"]]


def test_not_root_or_no_apt_skips_without_failing(monkeypatch, capsys):
    calls = fake_env(monkeypatch, have={"apt-get"}, root=False)
    assert not install.install_chromium() and calls == []
    calls = fake_env(monkeypatch, have=set(), root=True)
    assert not install.install_chromium() and calls == []
    assert "browser test will skip" in capsys.readouterr().out


def test_apt_failure_updates_once_then_gives_up(monkeypatch, capsys):
    calls = fake_env(monkeypatch, have={"apt-get"}, root=True, apt_rc=100)
    assert not install.install_chromium()
    assert [c[1] for c in calls] == ["install", "update", "install"]
    calls = fake_env(monkeypatch, have={"apt-get"}, root=True, raises=True)
    assert not install.install_chromium() and len(calls) == 3
    assert "could not be installed" in capsys.readouterr().out
