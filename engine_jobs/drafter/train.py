"""Training of the head on distilled samples: teacher forcing, as Apple's ``recurrent_drafting/train``.

At each response position t the head sees the base's hidden state h_t and the embeddings of the guaranteed
token x[t+1] and the gold tokens after it, and learns x[t+2] .. x[t+1+draft_len]: the i-th draft is
trained on the base's own tokens before it, as verification accepts it only after those. The loss is the
cross-entropy averaged over valid targets per draft position, then over draft positions (Apple sums the
positions; under Adam the two train alike). The optimiser is Apple's: AdamW without weight decay, 10 %
linear warmup, cosine decay, gradients clipped at norm 1. Data parallel under torchrun: each rank trains its
DistributedSampler share of the sequences with DistributedDataParallel averaging the gradients.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from .distill import Sample
from .model import ReDrafterHead

IGNORE = -100
WARMUP_FRACTION = 0.1
MAX_GRAD_NORM = 1.0


@dataclass(frozen=True)
class TrainConfig:
    draft_len: int
    learning_rate: float
    batch_size: int
    epochs: int
    max_steps: int | None
    seed: int


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed() -> Distributed:
    """torchrun's process group when WORLD_SIZE > 1 (nccl on GPUs, gloo on CPUs), else one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world <= 1:
        return Distributed(device=device)
    import torch.distributed as dist

    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Distributed(rank=dist.get_rank(), world=dist.get_world_size(), device=device)


def examples(sample: Sample, draft_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden [M, H], inputs [M, draft_len], targets [M, draft_len]) for the sample's M trainable positions.

    Position t = prompt_len - 1 + i: inputs x[t+1 .. t+draft_len], targets x[t+2 .. t+1+draft_len]
    (IGNORE past the sequence's end); positions with no target at all are dropped.
    """
    assert sample.hidden is not None, "distill the sample's hidden states first"
    n, start = len(sample.ids), sample.prompt_len - 1
    count = max(0, n - 2 - start)  # t from start to n - 3
    ids = torch.tensor(sample.ids + [IGNORE] * (draft_len + 1), dtype=torch.long)
    t = start + torch.arange(count)[:, None]
    k = torch.arange(draft_len)[None, :]
    inputs, targets = ids[t + 1 + k], ids[t + 2 + k]
    inputs = inputs.masked_fill(inputs == IGNORE, 0)  # an input after the end feeds only IGNOREd targets
    return sample.hidden[:count], inputs, targets


def draft_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over draft positions of the mean cross-entropy of that position's valid targets."""
    vocab = logits.shape[-1]
    per_position = []
    for k in range(targets.shape[-1]):
        valid = targets[:, k] != IGNORE
        if valid.any():
            per_position.append(nn.functional.cross_entropy(logits[valid, k].reshape(-1, vocab), targets[valid, k]))
    return torch.stack(per_position).mean()


@torch.no_grad()
def teacher_forced(
    head: ReDrafterHead,
    samples: list[Sample],
    embedding: torch.Tensor,
    draft_len: int,
    batch_size: int = 64,
) -> dict[str, list[float]]:
    """Per draft position: the mean cross-entropy (``loss``) and the top-1 accuracy (``top1``) of the head on
    ``samples``, teacher-forced as in training. On held-out samples against training samples it separates a
    head that drafts from one that memorised its training continuations (low training loss, held-out loss
    near or above ``log(vocab)``)."""
    was_training = head.training
    head.eval()
    device = next(head.parameters()).device
    table = embedding.to(device, torch.float32)
    loss_sum = torch.zeros(draft_len, dtype=torch.float64)
    hits = torch.zeros(draft_len, dtype=torch.float64)
    count = torch.zeros(draft_len, dtype=torch.float64)
    data = [examples(s, draft_len) for s in samples]
    for begin in range(0, len(data), batch_size):
        batch = data[begin : begin + batch_size]
        targets = torch.cat([b[2] for b in batch]).to(device)
        if len(targets) == 0:
            continue
        hidden = torch.cat([b[0] for b in batch]).to(device, torch.float32)
        logits = head(hidden, nn.functional.embedding(torch.cat([b[1] for b in batch]).to(device), table))
        valid = targets != IGNORE
        safe = targets.masked_fill(~valid, 0)
        nll = nn.functional.cross_entropy(logits.transpose(1, 2), safe, reduction="none")
        loss_sum += (nll * valid).sum(0).double().cpu()
        hits += ((logits.argmax(-1) == targets) & valid).sum(0).double().cpu()
        count += valid.sum(0).double().cpu()
    head.train(was_training)
    per = count.clamp(min=1)
    return {
        "loss": [round(float(v), 6) for v in loss_sum / per],
        "top1": [round(float(v), 6) for v in hits / per],
        "targets": [int(v) for v in count],
    }


def schedule(total_steps: int) -> Callable[[int], float]:
    warmup = max(1, math.ceil(WARMUP_FRACTION * total_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def shard(count: int, dist: Distributed, seed: int) -> list[int]:
    """This rank's sequences: DistributedSampler's share (every rank the same number of steps)."""
    if dist.world <= 1:
        return list(range(count))
    from torch.utils.data import Dataset, DistributedSampler

    # a sampler only needs len() of what it samples: the indices themselves stand in for the dataset
    sampler: DistributedSampler[int] = DistributedSampler(
        cast("Dataset[int]", range(count)), num_replicas=dist.world, rank=dist.rank, shuffle=True, seed=seed
    )
    return list(sampler)


def total_steps(samples: int, config: TrainConfig) -> int:
    """Optimizer steps for ``samples`` sequences on this rank: ``epochs`` passes, at most ``max_steps``."""
    total = config.epochs * max(1, math.ceil(samples / config.batch_size))
    return total if config.max_steps is None else min(total, config.max_steps)


def train_head(
    head: ReDrafterHead,
    samples: list[Sample],
    embedding: torch.Tensor,
    config: TrainConfig,
    dist: Distributed = Distributed(),
    progress: Callable[[int, int, float], None] | None = None,
) -> list[dict[str, float]]:
    """Train ``head`` in place on this rank's ``samples``; returns the curve: ``{"step", "loss"}`` per step.

    ``embedding`` is the base's input embedding table [vocab, hidden] (frozen, not part of the head).
    """
    device = dist.device
    head.to(device).train()
    model: nn.Module = head
    if dist.world > 1:
        model = nn.parallel.DistributedDataParallel(head, device_ids=[device.index] if device.type == "cuda" else None)
    embedding = embedding.to(device, torch.float32)
    data = [examples(s, config.draft_len) for s in samples]
    total = total_steps(len(samples), config)
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.learning_rate, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(total))
    generator = torch.Generator().manual_seed(config.seed + dist.rank)
    curve: list[dict[str, float]] = []
    step = 0
    while step < total:
        order = torch.randperm(len(samples), generator=generator).tolist()
        for begin in range(0, len(order), config.batch_size):
            if step >= total:
                break
            batch = [data[i] for i in order[begin : begin + config.batch_size]]
            hidden = torch.cat([b[0] for b in batch]).to(device, torch.float32)
            inputs = torch.cat([b[1] for b in batch]).to(device)
            targets = torch.cat([b[2] for b in batch]).to(device)
            loss: torch.Tensor
            if len(targets) == 0:  # responses of one token: nothing to draft
                loss = torch.stack([p.sum() for p in head.parameters()]).sum() * 0.0
            else:
                logits = model(hidden, nn.functional.embedding(inputs, embedding))
                loss = draft_loss(logits, targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            scheduler.step()
            step += 1
            value = float(loss.detach())
            curve.append({"step": step, "loss": value})
            if progress is not None:
                progress(step, total, value)
    head.eval()
    return curve
