"""A hub id with no reachable hub, said at once (issue 59).

Without this, a hub id on a machine with no network costs transformers' retries (34 lines over 80 s) before its
error. Before any config is read, a hub id (a ``model.path`` that is no local folder) gets a short HTTP HEAD to
the hub's endpoint (``HF_ENDPOINT``), bounded as a whole (name lookup included) by ``PROBE_TIMEOUT_S``. Unreachable:
a copy in the local hub cache is used offline (``HF_HUB_OFFLINE`` set for this process, one line saying so);
otherwise one error line names the ways to get a model without a hub.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import urllib.error
import urllib.request

from hybridflow.errors import ModelError

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 3.0
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

NO_HUB_FIXES = ("use `hybridflow models fetch` (the offline default, SmolLM2-135M-Instruct), `hybridflow models tiny "
                "DIR` (a tiny random test model) or a local Hugging Face folder; HF_HUB_OFFLINE=1 uses the hub cache")


def is_hub_id(path: str) -> bool:
    """``org/name`` (or ``name``) that is no existing local path: what transformers would look up on the hub."""
    return not os.path.exists(os.path.expanduser(path)) and bool(HUB_ID.match(path))


def hub_reachable(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``endpoint`` answers an HTTP HEAD (any status) within ``timeout`` seconds in all: the request runs in
    a thread, since a resolver with no network can take longer than any socket timeout, and a bare TCP connect is
    not enough (a sandbox's proxy may accept connections it cannot forward)."""
    result: list[bool] = []

    def head() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
            result.append(True)
        except urllib.error.HTTPError:
            result.append(True)  # the hub answered
        except (OSError, ValueError):
            result.append(False)

    probe = threading.Thread(target=head, daemon=True)
    probe.start()
    probe.join(timeout)
    return bool(result and result[0])


def _cached(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def go_offline() -> None:
    """Offline hub mode for this process (transformers asks ``huggingface_hub.constants`` at each call)."""
    from huggingface_hub import constants

    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True


def ensure_hub_reachable(path: str) -> None:
    """Nothing for a local folder, offline mode, or a reachable hub; a cached hub id goes offline; else one line."""
    from huggingface_hub import constants

    if not is_hub_id(str(path)) or constants.HF_HUB_OFFLINE or hub_reachable(constants.ENDPOINT):
        return
    if _cached(str(path)):
        logger.warning("hybridflow: the hub (%s) is not reachable: model %s loads from the local hub cache "
                       "(HF_HUB_OFFLINE=1)", constants.ENDPOINT, path)
        go_offline()
        return
    raise ModelError(f"model path {path!r} is a hub id, but the hub ({constants.ENDPOINT}) cannot be reached "
                     f"within {PROBE_TIMEOUT_S:.0f} s and the model is not in the hub cache: {NO_HUB_FIXES}")
