"""The rollout worker: prompts in, n sampled responses per prompt out, in verl's layout.

Output batch (B = prompts x n, rows of one prompt adjacent, i.e. ``repeat(n, interleave)``):

    prompts          [B, P]   left-padded prompt ids
    responses        [B, T]   right-padded response ids (T = longest response in the batch)
    input_ids        [B, P+T] prompts ++ responses
    attention_mask   [B, P+T] 1 on real tokens
    position_ids     [B, P+T] continue counting from the prompt's last position
    response_mask    [B, T]   1 on generated tokens (EOS included)
    rollout_log_probs [B, T]  log-probs the engine sampled with (0 on padding)
    non-tensors: the prompt's fields repeated, plus ``finish_reason``

With agent loops (``multi_turn.enable``), ``prompts`` are the loops' prompts (with the tool
schemas), ``responses`` hold generated turns and observations, ``response_mask`` is 0 on the
observation (tool / user) tokens while ``attention_mask`` is 1 on them; a vision-language policy's
``multi_modal_inputs`` hold every image of the conversation (the prompt's, then the tools'); non-tensors add verl's
``__num_turns__`` and ``tool_call_counts`` and the per-row agent counts ``agent/{name}``, and
``extra_info`` gains what the reward function may use (tool_rewards, turn_scores, num_turns).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterable

import torch

from hybridflow.data.batch import Batch
from hybridflow.data.padding import pad_sequences, position_ids_from_mask
from hybridflow.errors import RolloutError
from hybridflow.rollout import Completion, SamplingParams
from hybridflow.rollout.engine import capabilities_of, partial_session

logger = logging.getLogger(__name__)


class EngineHandover:
    """The engine's lock, and a partial rollout's weight-sync handshake (verl's partial rollout).

    A weight sync asks for the engine (``sync``); a running partial generate sees ``requested()`` between two
    decode steps, pauses its in-flight sequences and lends the lock (``wait``) until the new weights (and their
    ``version``) are loaded, then continues them. Without a partial generate running, the sync takes the lock
    as soon as the engine is free. Lives in the rank that holds the engine, so it works the same in one
    process and in a Ray actor that runs a generate and a sync at once."""

    def __init__(self, *, version: int = 0):
        self.lock = threading.Lock()
        self.version = version
        """The version of the weights loaded in the engine now."""
        self.pending = False
        self.cond = threading.Condition()

    def requested(self) -> bool:
        """A weight sync is waiting for the engine."""
        return self.pending

    def wait(self) -> int:
        """The generating thread (holding the lock): hand the engine over until the sync is done; returns the
        new weights' version."""
        self.lock.release()
        try:
            with self.cond:
                self.cond.wait_for(lambda: not self.pending)
        finally:
            self.lock.acquire()
        return self.version

    @contextlib.contextmanager
    def sync(self):
        """The weight sync: hold the engine, as soon as a running partial generate has paused."""
        with self.cond:
            self.pending = True
            self.cond.notify_all()
        try:
            with self.lock:
                yield
        finally:
            with self.cond:
                self.pending = False
                self.cond.notify_all()


class RolloutWorker:
    """Wraps a generation engine; weights are pushed in by the trainer after every update.

    ``free_cache_engine`` (verl's ``rollout.free_cache_engine``): after every ``generate`` the engine gives its KV
    cache's memory back (the native engine's ``release_kv_cache``; vLLM / SGLang sleep), so the old log-probs, the
    reference, the update and the weight sync that follow run without it, as verl's hybrid engine frees it after
    ``generate_sequences``; the next ``generate`` allocates it again. Engines with nothing to free (HF) are left
    as they are."""

    def __init__(self, *, engine, pad_token_id: int, agent_loops=None, free_cache_engine: bool = False):
        self.engine = engine
        self.pad_token_id = pad_token_id
        self.agent_loops = agent_loops
        self.free_cache_engine = free_cache_engine
        self.kept_cache_reported = False
        self.handover = EngineHandover()
        """One call uses the engine at a time; a partial generate lends it to a weight sync."""

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int | None = None) -> None:
        """New weights, once the engine is free (a running partial generate pauses for them); ``version`` (the
        async trainers' weight version) tags the tokens sampled with them."""
        with self.handover.sync():
            self.engine.load_weights(named_tensors)
            if version is not None:
                self.handover.version = version

    def generate(self, prompts: Batch, params: SamplingParams, *, partial: bool = False) -> Batch:
        """Sample ``params.n`` responses for each prompt of ``prompts`` (needs ``raw_prompt_ids``); ``partial``:
        a weight sync may land between two decode steps (:meth:`generate_partial`)."""
        with self.handover.lock:
            try:
                return self._generate(prompts, params, partial=partial)
            finally:
                if self.free_cache_engine:
                    self.release_kv_cache()

    def _generate(self, prompts: Batch, params: SamplingParams, *, partial: bool) -> Batch:
        self.start_from_a_clean_engine()
        if self.agent_loops is not None:
            return self.run_agent_loops(prompts, params)
        if partial:
            return self.generate_partial(prompts, params, handover=self.handover)
        # a VLM's images go with their prompts (the engine's prefill encodes them)
        images = {}
        if "multi_modal_inputs" in prompts:
            images["multi_modal_inputs"] = list(prompts["multi_modal_inputs"])
        completions = self.engine.generate([list(ids) for ids in prompts["raw_prompt_ids"]], params, **images)
        return self.assemble(prompts, completions, n=params.n)

    def release_kv_cache(self) -> None:
        """The engine's KV cache memory back to the device (``free_cache_engine``); engines without one to free
        (HF) have no ``release_kv_cache``. A native engine refuses while a streaming session over it is open (warned
        once)."""
        if capabilities_of(self.engine).sleeps and not self.engine.release_kv_cache() and not self.kept_cache_reported:
            self.kept_cache_reported = True
            logger.warning("rollout.free_cache_engine=True, but the %s engine kept its KV cache: a streaming session "
                           "or request queue over the native engine is still open, or rollout.engine_kwargs built "
                           "vLLM / SGLang without sleep mode, or vLLM runs on a CPU (no sleep mode there)", type(self.engine).__name__)

    def start_from_a_clean_engine(self) -> None:
        """Drop what an earlier batch left in the engine's prefix cache (e.g. the validation rollout before the
        next step's, which share weights): prefix caching then serves the turns of this batch's conversations
        only, and a batch's log-probs do not depend on what ran before it, so a killed and resumed run
        reproduces the uninterrupted one bit for bit. Engines without a prefix cache have nothing to drop."""
        if capabilities_of(self.engine).sleeps:
            self.engine.reset_prefix_cache()

    def generate_partial(self, prompts: Batch, params: SamplingParams, *, handover: EngineHandover) -> Batch:
        """A generation that a weight sync may interrupt between two decode steps (verl's partial rollout); the
        caller holds ``handover.lock``.

        When ``handover.requested()``, the in-flight sequences are paused, the engine is handed over
        (``handover.wait()`` returns once the new weights are loaded, with their version), and the sequences
        continue from their exact next token with the new weights. ``rollout_log_probs`` hold each token's
        behaviour log-prob, whichever weights sampled it; ``rollout_first_version`` / ``rollout_last_version``
        ``[B]`` are the weight versions of a response's first and last token."""
        if not capabilities_of(self.engine).pauses:
            raise RolloutError(f"partial rollouts need the native or vLLM engine (rollout.name=native or vllm), not "
                               f"{type(self.engine).__name__}")
        if "multi_modal_inputs" in prompts and any(prompts["multi_modal_inputs"]):
            raise RolloutError("async_training.partial_rollout=True with a vision-language policy: a paused sequence "
                               "does not keep its prompt's images; set async_training.partial_rollout=False")
        prompt_ids = [list(ids) for ids in prompts["raw_prompt_ids"]]
        session = partial_session(self.engine, params, max_prompt_length=max(map(len, prompt_ids)),
                                  weight_version=handover.version)
        done = []
        try:
            for index, ids in enumerate(prompt_ids):
                session.submit(index, ids)
            while not session.idle:
                done += session.step()
                if handover.requested():
                    paused = session.pause()
                    session.weights_reloaded(version=handover.wait())
                    session.resume(paused)
        finally:
            session.close()
        done.sort(key=lambda c: (c.request_id, c.output_index))
        batch = self.assemble(prompts, done, n=params.n)
        versions = [c.weight_versions or [session.weight_version] for c in done]
        batch["rollout_first_version"] = torch.tensor([v[0] for v in versions])
        batch["rollout_last_version"] = torch.tensor([v[-1] for v in versions])
        return batch

    def assemble(self, prompts: Batch, completions: list[Completion], *, n: int) -> Batch:
        """Join prompts (repeated n times, interleaved) with their completions."""
        batch = prompts.repeat(n, interleave=True)
        responses = pad_sequences([c.token_ids for c in completions], pad_value=self.pad_token_id, side="right")
        lengths = torch.tensor([len(c.token_ids) for c in completions])
        response_mask = (torch.arange(responses.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)).long()
        log_probs = torch.zeros(responses.shape, dtype=torch.float32)
        for row, completion in enumerate(completions):
            if completion.logprobs:
                log_probs[row, : len(completion.logprobs)] = torch.tensor(completion.logprobs)
        prompt_ids = batch.pop(["input_ids"])["input_ids"]
        prompt_mask, prompt_pos = batch["attention_mask"], batch["position_ids"]
        steps = torch.arange(1, responses.shape[1] + 1).unsqueeze(0)
        batch["prompts"] = prompt_ids
        batch["responses"] = responses
        batch["response_mask"] = response_mask
        batch["rollout_log_probs"] = log_probs
        batch["input_ids"] = torch.cat([prompt_ids, responses], dim=1)
        batch["attention_mask"] = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
        batch["position_ids"] = torch.cat([prompt_pos, prompt_pos[:, -1:] + steps], dim=1)
        batch["finish_reason"] = [c.finish_reason for c in completions]
        return batch

    def run_agent_loops(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Each of the n samples of each prompt runs its own agent loop; all share the engine."""
        batch = prompts.repeat(params.n, interleave=True)
        rows = [{key: batch[key][i] for key in batch.non_tensors} for i in range(len(batch))]
        outputs = self.agent_loops.run(rows, params)
        for key in ("input_ids", "attention_mask", "position_ids"):
            batch.pop([key])
        prompt_ids = pad_sequences([o.prompt_ids for o in outputs], pad_value=self.pad_token_id, side="left")
        width = prompt_ids.shape[1]
        lengths = torch.tensor([len(o.prompt_ids) for o in outputs])
        prompt_mask = (torch.arange(width).unsqueeze(0) >= (width - lengths).unsqueeze(1)).long()
        responses = pad_sequences([o.response_ids for o in outputs], pad_value=self.pad_token_id, side="right")
        response_attention = pad_sequences([[1] * len(o.response_ids) for o in outputs], pad_value=0, side="right")
        batch["prompts"] = prompt_ids
        batch["responses"] = responses
        batch["response_mask"] = pad_sequences([o.response_mask for o in outputs], pad_value=0, side="right")
        log_probs = torch.zeros(responses.shape, dtype=torch.float32)
        for row, output in enumerate(outputs):
            log_probs[row, : len(output.response_logprobs)] = torch.tensor(output.response_logprobs)
        batch["rollout_log_probs"] = log_probs
        batch["input_ids"] = torch.cat([prompt_ids, responses], dim=1)
        batch["attention_mask"] = torch.cat([prompt_mask, response_attention.long()], dim=1)
        batch["position_ids"] = position_ids_from_mask(batch["attention_mask"])
        batch["finish_reason"] = [o.finish_reason for o in outputs]
        batch["__num_turns__"] = [o.num_turns for o in outputs]
        batch["tool_call_counts"] = [int(o.metrics.get("tool_calls", 0)) for o in outputs]
        for name in sorted({k for o in outputs for k in o.metrics}):
            batch[f"agent/{name}"] = [float(o.metrics.get(name, 0.0)) for o in outputs]
        batch["extra_info"] = [{**(row.get("extra_info") or {}), **o.extra_info} for row, o in zip(rows, outputs)]
        if "multi_modal_inputs" in batch or any(o.multi_modal_inputs for o in outputs):
            batch["multi_modal_inputs"] = [o.multi_modal_inputs for o in outputs]  # prompt's and tools' images
        return batch
