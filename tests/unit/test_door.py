"""The door (issue 31): every config value that becomes a path, a process argument or a file
read is resolved and said (``--dry-run``), an output that would escape its folder is refused
(exit 2) before anything is written or deleted, and a head address where nothing answers is
said within seconds rather than waited on. The launcher runs as the user runs it (a real
``python -m cluster.launch`` process) where the exit status and the files are the point."""
from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster import launch

ROOT = Path(__file__).resolve().parents[2]


def launch_cli(*args, timeout=120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "V05_OUTPUT_ROOT")}
    return subprocess.run([sys.executable, "-m", "cluster.launch", "v05.yaml", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links not followed): its kind and content digest, or where
    a link points."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link -> " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_a_run_name_out_of_the_output_dir_is_refused_and_a_nested_one_is_fine(tmp_path):
    out = tmp_path / "out"
    for name in (str(tmp_path / "elsewhere"), "../../elsewhere", "exp1/../../up"):
        r = launch_cli(f"run.output_dir={out}", f"run.name={name}", "--dry-run")
        assert r.returncode == 2, (name, r.stdout[-500:], r.stderr[-2000:])
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("error: invalid config: run.name: must name a folder under "
                               "run.output_dir") and repr(name) in line, line
    assert not (tmp_path / "elsewhere").exists() and not out.exists()
    r = launch_cli(f"run.output_dir={out}", "run.name=exp1/seed0", "--dry-run")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"# run directory: {out / 'exp1' / 'seed0'}\n" in r.stdout
    assert not out.exists()  # a dry run writes nothing


def test_the_dry_run_names_every_path_as_it_resolves(tmp_path, monkeypatch, capsys):
    """Dataset files relative to the current folder, what the run writes and where, the
    model, the V0 prior's files, the cluster and rendezvous addresses."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(
        "".join(f'{{"prompt": "What is {i} + 1?", "answer": "{i + 1}"}}\n' for i in range(6)))
    out = tmp_path / "runs"
    rc = launch.main([str(ROOT / "v05.yaml"), f"run.output_dir={out}", "run.name=a/b",
                      "task.name=math", "task.path=data/train.jsonl", "task.n_heldout=1",
                      "logging.tensorboard=true", "run.record_rollouts=true",
                      "model.path=../models/policy", "prior.backend=v0",
                      "prior.options={path: v0files}", "cluster.address=127.0.0.1:6390",
                      "cluster.weight_sync={type: gloo, master_address: 127.0.0.1}",
                      "--dry-run"])
    said = capsys.readouterr().out
    assert rc == 0, said
    paths = dict(line[2:].split(": ", 1) for line in said.splitlines()
                 if line.startswith("# ") and ": " in line)
    assert paths["run directory"] == str(out / "a" / "b")
    assert paths["task.path"] == str(tmp_path / "data" / "train.jsonl")
    for what in ("checkpoints", "logs", "tb", "rollouts.msgpack", "final"):
        assert any(k.startswith(f"writes {what}") and v == str(out / "a" / "b" / what)
                   for k, v in paths.items()), (what, paths)
    assert paths["model.path"] == f"{tmp_path.parent / 'models' / 'policy'} (does not exist)"
    assert paths["prior.options.checkpoint"] == str(tmp_path / "v0files" /
                                                    "v_0_for_grpo_training.pt")
    assert paths["prior.options.embedding_model"] == str(tmp_path / "v0files" /
                                                         "Qwen3-Embedding-0.6B")
    assert paths["cluster.address"] == "127.0.0.1:6390"
    assert paths["cluster.weight_sync.master_address"] == "127.0.0.1"
    assert not out.exists()


def test_links_out_of_the_run_directory_are_refused_before_anything_is_deleted(tmp_path,
                                                                               monkeypatch):
    """The run directory is real, but an output in it (checkpoints/, a log file) is a link
    to somewhere else: the run would write, append or delete there. Refused (exit 2) with
    run.overwrite=true too, and nothing anywhere changes."""
    import cluster.launch as launch_mod

    def tripwire(*a, **k):
        raise AssertionError("a refused request reached the cluster")
    monkeypatch.setattr(launch_mod, "run", tripwire)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "ckpts").mkdir(parents=True)
    (elsewhere / "ckpts" / "keep.bin").write_bytes(b"someone's")
    (elsewhere / "notes.txt").write_text("someone's notes\n")
    run = tmp_path / "out" / "r"
    (run / "logs").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    # W&B's own folder holds W&B's links to its debug logs: not the run's writes.
    (run / "wandb" / "offline-run-1").mkdir(parents=True)
    (run / "wandb" / "offline-run-1" / "debug-core.log").symlink_to(elsewhere / "notes.txt")
    assert launch.main([str(ROOT / "v05.yaml"), f"run.output_dir={tmp_path / 'out'}",
                        "run.name=r", "run.overwrite=true", "--dry-run"]) == 0
    for link, target in (("checkpoints", elsewhere / "ckpts"),
                         ("logs/generator-0.log", elsewhere / "notes.txt"),
                         ("wandb/v05-run-id", elsewhere / "notes.txt")):
        (run / link).symlink_to(target)
        before = tree(tmp_path)
        for extra in ([], ["run.overwrite=true"], ["--dry-run"]):
            rc = launch.main([str(ROOT / "v05.yaml"), f"run.output_dir={tmp_path / 'out'}",
                              "run.name=r", *extra])
            assert rc == 2, (link, extra)
            assert tree(tmp_path) == before, (link, extra)
        (run / link).unlink()


def test_a_refused_request_writes_and_deletes_nothing_anywhere(tmp_path):
    """Real launches (not dry runs) of refused requests, each with run.overwrite=true:
    the file tree of the whole test folder, inside the output folder and outside it, is the
    same before and after, byte for byte."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "summary.json").write_text('{"someone": "else"}')
    (elsewhere / "checkpoints").mkdir()
    (elsewhere / "checkpoints" / "latest").write_text("step9")
    out = tmp_path / "out"
    (out / "prev" / "final").mkdir(parents=True)
    (out / "prev" / "final" / "model.safetensors").write_bytes(b"trained")
    (out / "prev" / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "link").symlink_to(elsewhere)
    (out / "prev" / "wandb").symlink_to(elsewhere)
    before = tree(tmp_path)
    for name in (str(elsewhere), "../elsewhere", "link", "link/inner", "prev"):
        r = launch_cli(f"run.output_dir={out}", f"run.name={name}", "run.overwrite=true",
                       "run.max_steps=1", "cluster.address=local")
        assert r.returncode == 2, (name, r.stderr[-2000:])
        assert r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
        assert tree(tmp_path) == before, name


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_head_address_where_nothing_answers_is_said_within_seconds(tmp_path):
    """cluster.address names a port where no Ray head listens: one line and exit 2 within
    seconds (Ray's own join retries for minutes), before any model is loaded, nothing
    written; the same for RAY_ADDRESS."""
    port = unused_port()
    t0 = time.monotonic()
    r = launch_cli(f"run.output_dir={tmp_path / 'out'}", f"cluster.address=127.0.0.1:{port}")
    took = time.monotonic() - t0
    assert r.returncode == 2 and took < 30, (took, r.stderr[-2000:])
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: cluster.address 127.0.0.1:{port}: no Ray head answers at "
                           f"127.0.0.1:{port}") and "ray start --head" in line, line
    assert not (tmp_path / "out").exists()


def test_check_address_reads_each_form_of_address(monkeypatch):
    from cluster.config.door import check_address, host_port

    assert host_port("127.0.0.1:6379") == ("127.0.0.1", 6379)
    assert host_port("ray://10.0.0.2:10001") == ("10.0.0.2", 10001)
    assert host_port("[::1]:6379") == ("::1", 6379)
    assert host_port("auto") is None and host_port("local") is None
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    check_address(None)       # nothing given: a local cluster is started
    check_address("local")
    port = unused_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(ConnectionError, match=f"RAY_ADDRESS 127.0.0.1:{port}: no Ray head"):
        check_address(None)
    check_address("local")    # a private cluster: RAY_ADDRESS is not read
    with socket.socket() as s:  # something answers: it passes (Ray then says the rest)
        s.bind(("127.0.0.1", 0))
        s.listen()
        check_address(f"127.0.0.1:{s.getsockname()[1]}")
