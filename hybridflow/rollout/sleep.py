"""What an external engine (vLLM, SGLang) gave back for ``rollout.free_cache_engine`` and takes back when needed.

verl's hybrid engine releases the rollout's memory after ``generate_sequences`` and resumes it in two stages
before the next rollout: the weights before the weight sync writes into them, then the KV cache. The backends
here do the same: ``release()`` after every generate (the rollout worker), ``resume("weights")`` in
``load_weights``, ``resume("weights", "kv_cache")`` before a generate.
"""

from __future__ import annotations

from collections.abc import Callable

PARTS = ("weights", "kv_cache")


class ReleasedMemory:
    """The parts (:data:`PARTS`) released and not resumed yet, and the engine calls that release and resume them.

    Args:
        enabled: the engine was built able to release (vLLM's ``enable_sleep_mode``, SGLang's
            ``enable_memory_saver``); when not, ``release`` frees nothing and says so.
        release: frees every part (vLLM ``sleep(level=1)``, SGLang ``release_memory_occupation``).
        resume: takes back the named parts (vLLM ``wake_up(tags=...)``, SGLang ``resume_memory_occupation``).
    """

    def __init__(self, *, enabled: bool, release: Callable[[], None], resume: Callable[[list[str]], None]):
        self.enabled, self._release, self._resume = enabled, release, resume
        self.released: set[str] = set()

    def release(self) -> bool:
        """Free every part (once, however often called); ``False`` (nothing freed) when the engine cannot."""
        if not self.enabled:
            return False
        if not self.released:
            self._release()
            self.released = set(PARTS)
        return True

    def resume(self, *parts: str) -> None:
        """Take back those of ``parts`` that are released, in :data:`PARTS` order."""
        taking = [part for part in PARTS if part in parts and part in self.released]
        if taking:
            self._resume(taking)
            self.released -= set(taking)
