"""The door: every config value that becomes a path, a process argument or a file read,
resolved and said (``--dry-run`` prints them, ``resolved_paths``), and the cluster address
checked to answer before Ray is asked to join it (``check_address``).

Where outputs may go is ``cluster.config.paths``'s: the run directory lies inside
``run.output_dir`` (``inside``) and nothing the run writes there is a link out of it
(``links_out``). Inputs (the dataset, the model, the V0 prior's files) may be anywhere the
user points: they are read, never written, and are said here as they resolve.

Pure standard library and pydantic: nothing here imports an ML library or Ray.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

# What the run writes under its directory, by the setting that asks for it (None: always).
_WRITES = (("checkpoints", None), ("logs", None), ("final", "run.save_final"),
           ("snapshots", "run.snapshot_every"), ("rollouts.msgpack", "run.record_rollouts"),
           ("tb", "logging.tensorboard"), ("wandb", "logging.wandb"))


def _abs(p: str) -> str:
    return str(Path(p).expanduser().resolve())


def model_source(cfg) -> str:
    """What ``model.path`` will load, said without building or converting anything (a config
    for another machine still dry-runs; the launch itself checks it: ``ModelConfig.resolve``)."""
    path = cfg.model.path
    if path == "embedded":
        from tasks.policy import default_cache_dir, recipe_hash
        try:
            where = default_cache_dir() / "policy" / recipe_hash(task=cfg.task.name)
        except ValueError as err:
            return f"embedded: {err}"
        return f"embedded: {where}" + ("" if where.is_dir() else " (built there on first use)")
    from tasks.pretrained import PACKAGED, pretrained_dir
    if path in PACKAGED and not Path(path).exists():
        return f"packaged {path}: {pretrained_dir(path)} (converted there once)"
    p = Path(path).expanduser()
    if not p.exists() and len(path.split("/")) == 2 and not path.startswith((".", "/", "~")):
        return f"Hugging Face id {path}: the local cache only (HF_HUB_CACHE), never downloaded"
    return _abs(path) + ("" if p.exists() else " (does not exist)")


def _prior_files(cfg) -> list[tuple[str, str]]:
    """The V0 prior's files (backend or fallback ``v0``), as its options name them."""
    from actors.priors.v0 import resolve_v0_files

    out = []
    for backend, opts, key in ((cfg.prior.backend, cfg.prior.options, "prior.options"),
                               (cfg.prior.fallback, cfg.prior.fallback_options,
                                "prior.fallback_options")):
        if backend != "v0":
            continue
        try:
            files = resolve_v0_files(*(opts.get(k) for k in ("path", "checkpoint",
                                                              "tabpfn_head", "embedding_model")))
        except ValueError as err:
            out.append((key, str(err)))
            continue
        out += [(f"{key}.{k}", _abs(str(v))) for k, v in files.items()]
    return out


def resolved_paths(cfg) -> list[tuple[str, str]]:
    """(setting, what it resolves to) for every path, file read and process argument of
    ``cfg``: the run directory and what the run writes under it, the dataset files, the
    model, the V0 prior's files, the cluster address and the rendezvous address."""
    from cluster.config.paths import output_root

    run_dir = cfg.run_dir  # checked: inside run.output_dir, links followed
    out = [("run.output_dir", str(output_root(cfg.run.output_dir))),
           ("run directory", str(run_dir))]
    on = {"run.save_final": cfg.run.save_final, "run.snapshot_every": cfg.run.snapshot_every,
          "run.record_rollouts": cfg.run.record_rollouts,
          "logging.tensorboard": cfg.logging.tensorboard, "logging.wandb": cfg.logging.wandb}
    out += [(f"writes {name}" + (f" ({flag})" if flag else ""), str(run_dir / name))
            for name, flag in _WRITES if flag is None or on[flag]]
    out += [(f"task.{k}", _abs(getattr(cfg.task, k))) for k in ("path", "heldout_path")
            if getattr(cfg.task, k) is not None]
    out.append(("model.path", model_source(cfg)))
    out += _prior_files(cfg)
    out.append(("cluster.address", address_source(cfg.cluster.address)))
    ws = cfg.cluster.weight_sync_config
    if ws.master_address:
        out.append(("cluster.weight_sync.master_address", ws.master_address))
    return out


def address_source(address: str | None) -> str:
    env = os.environ.get("RAY_ADDRESS")
    if address == "local":
        return "local: a private cluster on 127.0.0.1"
    if address is None and env:
        return f"RAY_ADDRESS={env}"
    if address is None:
        return "a cluster started with `ray start` on this machine, else a local one on 127.0.0.1"
    return address


def host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a Ray address that names one (``host:port``, ``ray://host:port``);
    None for ``auto``, ``local`` and anything without a port (Ray says what is wrong then)."""
    rest = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_address(address: str | None, timeout_s: float = 5.0) -> None:
    """A cluster address given (``cluster.address`` or ``RAY_ADDRESS``) must answer: one TCP
    connection to its host and port within ``timeout_s``, before Ray is asked to join it
    (``ray.init`` retries an address where nothing listens for minutes). ConnectionError
    naming the address otherwise."""
    given = address if address not in (None, "local") else (
        os.environ.get("RAY_ADDRESS") if address is None else None)
    where = "cluster.address" if address not in (None, "local") else "RAY_ADDRESS"
    hp = host_port(given) if given else None
    if hp is None:
        return
    try:
        socket.create_connection(hp, timeout=timeout_s).close()
    except OSError as err:
        why = "timed out" if isinstance(err, TimeoutError) else (err.strerror or type(err).__name__)
        raise ConnectionError(
            f"{where} {given}: no Ray head answers at {hp[0]}:{hp[1]} ({why} within "
            f"{timeout_s:g} s); start it (`ray start --head --port={hp[1]}`) or give the address "
            "of a running one (its GCS port, 6379 by default)") from None
