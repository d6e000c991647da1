"""What the OpenAI front serves and the limits it enforces on hostile or excessive input (docs/openai-api.md#limits)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from .contract import MANIFEST_FILE, ServingConfig


@dataclass(frozen=True)
class FrontSettings:
    """What the front serves and the limits it enforces (defaults: docs/openai-api.md#limits)."""

    model_id: str
    max_input_len: int
    max_seq_len: int
    created: int  # unix time of the engine artifact (its manifest), reported by /v1/models
    owned_by: str = "redrafter-operator"
    #: request body size (413); a prompt of maxInputLen tokens is far smaller
    max_body_bytes: int = 4 * 1024 * 1024
    #: seconds a client may take to send its body (408)
    body_timeout: float = 30.0
    #: nesting of arrays and objects in a body (400); OpenAI's bodies nest a handful of levels
    max_json_depth: int = 32
    #: chat messages per request (400)
    max_messages: int = 1024
    #: characters of one stop sequence (400); OpenAI allows at most 4 sequences, checked by the protocol
    max_stop_chars: int = 256
    #: seconds one generation may take once admitted, queue wait excluded (504, or an error event)
    request_timeout: float = 600.0
    #: generations running at once; the engine batches at most maxBatchSize, Triton queues the rest
    max_in_flight: int = 64
    #: requests waiting for a slot; past it: 429 with Retry-After
    max_queued: int = 256
    #: seconds a request may wait for a slot (429 with Retry-After)
    queue_timeout: float = 30.0
    #: seconds clients are told to wait in Retry-After
    retry_after: int = 1
    #: a readiness check of Triton that takes longer answers "not ready": a stuck server (or a stuck
    #: entry model) turns the pod's readiness false within the probe's period, not never
    ready_timeout: float = 2.0
    #: directory of a mounted Secret of API keys (one per data entry); None: no authentication
    api_keys_dir: str | None = None

    @classmethod
    def from_config(cls, cfg: ServingConfig) -> "FrontSettings":
        manifest = Path(cfg.artifact_dir) / MANIFEST_FILE
        created = int(manifest.stat().st_mtime) if manifest.is_file() else int(time.time())
        # Twice the engine's batch keeps it full while some requests are in pre- or postprocessing.
        in_flight = max(2 * cfg.max_batch_size, 4)
        return cls(
            cfg.served_model_name,
            cfg.max_input_len,
            cfg.max_seq_len,
            created,
            max_in_flight=in_flight,
            max_queued=4 * in_flight,
            api_keys_dir=cfg.api_keys_dir,
        )
