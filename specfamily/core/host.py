"""Host transfer for the verifier: what of tokens, p and q lives on an accelerator reaches the CPU in one packed copy
per device (``to_host``; the other way, a batched pass's host token ids in one copy: ``to_device``), and where the
walk's uniforms come from (``HostDraws``: one per try from a CPU generator; ``BlockDraws``: one block per pass drawn
on the accelerator's generator and moved with p and q).

Every final token is drawn by inversion (:func:`inverse_cdf`) from one uniform: one cumulative sum over the row's
blocks with mass, no draw per vocabulary entry (``torch.multinomial`` draws V exponentials). Tokens without mass are
never picked, so the draw reads only the kept support of a warped row. A drafter's sampled token is drawn the same
way on q's own device (:func:`draw`), with no host read."""

from __future__ import annotations

from collections.abc import Sequence

import torch

_CPU = torch.device("cpu")
BLOCK = 64  # inverse_cdf skips the all-zero blocks of this many tokens of a row


def seeded_generator(device: torch.device, seed: int) -> torch.Generator:
    """A request's generator: on ``device`` (an accelerator's own stream), on the host for the CPU and for a device
    that has no generators (``meta``, the stand-in device of :mod:`specfamily.testing.syncs`)."""
    own = device.type not in ("cpu", "meta")
    return (torch.Generator(device=device) if own else torch.Generator()).manual_seed(seed)


def uniform(generator: torch.Generator | None, device: torch.device) -> float:
    return torch.rand((), generator=generator, device=device, dtype=torch.float64).item()


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """A token of probs (V,) (any scale and float dtype, float64 sums): inversion of one uniform from ``generator``
    (its device's stream; torch's default one on probs' device when None)."""
    return inverse_cdf(probs, uniform(generator, draw_device(probs, generator)))


def draw(q: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """(1,) long on q's device: a token of q (V,) (any scale, float dtype; with mass) by inversion of one uniform
    from ``generator``, the way a drafter draws its next token, with no host read of q: ``torch.multinomial(q, 1)``
    checks q with two host reads on CUDA. A CPU q goes through :func:`sample`; any other is inverted on its device
    (:func:`device_inverse_cdf`) from a uniform drawn on the generator's device: one from a CPU generator is a
    Python float there (a kernel argument, nothing copied), one from an accelerator's stays a tensor."""
    if q.device.type == "cpu":
        return torch.tensor([sample(q, generator)])
    device = draw_device(q, generator)
    if device.type == "cpu":
        return device_inverse_cdf(q, uniform(generator, device))
    u = torch.rand((), generator=generator, device=device, dtype=torch.float64)
    return device_inverse_cdf(q, u.to(q.device, non_blocking=True))


def device_inverse_cdf(probs: torch.Tensor, u: float | torch.Tensor) -> torch.Tensor:
    """(1,) long: :func:`inverse_cdf`'s token of probs (V,) for u, computed without a branch or a host read. A token
    without mass is never picked even where the device's cumulative sum is not sequential (a parallel scan may
    round a zero's running sum up): the running sums of those tokens are replaced by the last sum with mass before
    them (a running maximum), so the first sum above u * total is always a token's with mass; u * total rounded up
    to the total (past every sum) gives the last token with mass. On the CPU: inverse_cdf's token, bit for bit."""
    q64 = probs.double()
    cdf = q64.cumsum(0).masked_fill(q64 <= 0, float("-inf")).cummax(0).values  # (V,) ascending, flat at zeros
    index = torch.searchsorted(cdf, u * cdf[-1:], right=True)  # (1,)
    last = probs.numel() - 1 - (q64.flip(0) > 0).long().argmax()  # () the last token with mass
    return torch.minimum(index, last)


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The token whose cumulative-probability interval holds u * total (the cumulative sum in float64, whatever
    probs' float dtype); never one of probability 0. A row of whole BLOCKs sums only its blocks with mass: a zero
    adds nothing to a sequential sum, so the token and the sums are those of the whole row's cumsum, bit for bit."""
    if probs.numel() % BLOCK == 0 and probs.device.type == "cpu":
        blocks = probs.reshape(-1, BLOCK)
        live = (blocks.amax(dim=1) != 0).nonzero().view(-1)  # the blocks with mass (or a NaN), in token order
        if live.numel():
            index = _inverse(blocks[live].view(-1).double(), u)
            return int(live[index // BLOCK]) * BLOCK + index % BLOCK
    return _inverse(probs.double(), u)


def _inverse(probs: torch.Tensor, u: float) -> int:
    cdf = probs.cumsum(0)  # (V,) float64, sequential
    total = cdf[-1].item()
    if not 0 < total < float("inf"):  # NaN fails too: a row without mass, or with a NaN or an infinity
        raise ValueError(f"cannot draw a token from a row whose sum is {total}: not a distribution")
    at = cdf.new_tensor([u * total])
    index = int(torch.searchsorted(cdf, at, right=True))
    if index >= probs.numel():  # u * total rounded up to the total: the last token with mass
        index = int(torch.nonzero(probs).max())
    return index


class HostDraws:
    """Uniforms drawn one at a time from a CPU generator (or torch's global one): the stream of one draw per try."""

    def __init__(self, generator: torch.Generator | None) -> None:
        self.generator = generator

    def uniform(self) -> float:
        return uniform(self.generator, _CPU)

    def sample(self, probs: torch.Tensor) -> int:
        return sample(probs, self.generator)


class BlockDraws:
    """Uniforms drawn as one block on an accelerator's generator and moved to the host with p and q."""

    def __init__(self, values: list[float]) -> None:
        self.values, self.used = values, 0

    def uniform(self) -> float:
        self.used += 1
        return self.values[self.used - 1]

    def sample(self, probs: torch.Tensor) -> int:
        return inverse_cdf(probs, self.values[-1])


def to_host(tensors: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """The tensors on the CPU, with one waiting device-to-host copy per device for all of them that live elsewhere:
    their bytes are copied into one (pinned, on CUDA) host buffer, every copy but the last queued without waiting, so
    dtypes, values and shapes are kept exactly and the host waits once. (Packing the bytes with ``torch.cat`` on the
    device instead ran into misaligned-address faults on an H200.)"""
    host = list(tensors)
    away: dict[torch.device, list[int]] = {}
    for i, tensor in enumerate(tensors):
        if tensor is not None and tensor.device.type != "cpu":
            away.setdefault(tensor.device, []).append(i)
    for device, indices in away.items():
        raw = [tensors[i].contiguous().reshape(-1).view(torch.uint8) for i in indices]
        offsets = _aligned_offsets([part.numel() for part in raw])
        pinned = device.type == "cuda" and torch.cuda.is_available()  # page-locked: a copy can be queued, not waited on
        flat = torch.empty(offsets[-1], dtype=torch.uint8, pin_memory=pinned)
        copies = [k for k, part in enumerate(raw) if part.numel()]
        for k in copies:
            flat[offsets[k] : offsets[k] + raw[k].numel()].copy_(raw[k], non_blocking=k != copies[-1])
        for k, i in enumerate(indices):
            host[i] = flat[offsets[k] : offsets[k] + raw[k].numel()].view(tensors[i].dtype).view(tensors[i].shape)
    return host


def to_device(tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Integer tensors (token ids) on ``device``: those on the host moved in one copy (joined, moved, and handed
    back as views of the one device tensor), those already on an accelerator as they are; on the CPU all as they
    are. The copy is queued, not waited on: CUDA stages a non-blocking copy from pageable host memory at once (the
    host tensor may go), and only a blocking one waits for the stream."""
    moved = list(tensors)
    away = [i for i, tensor in enumerate(tensors) if tensor.device.type == "cpu" and tensor.numel()]
    if device.type == "cpu" or not away:
        return moved
    joined = torch.cat([tensors[i].reshape(-1).to(torch.long) for i in away]).to(device, non_blocking=True)
    for i, part in zip(away, joined.split([tensors[i].numel() for i in away]), strict=True):
        moved[i] = part.view(tensors[i].shape)
    return moved


def _aligned_offsets(sizes: Sequence[int]) -> list[int]:
    """Where each of ``sizes`` bytes starts when every start is a multiple of 8, then the total."""
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size + (-size % 8))
    return offsets


def draw_device(p: torch.Tensor, generator: torch.Generator | None) -> torch.device:
    """Where the uniforms come from: the generator's device, or p's for torch's default generator."""
    return p.device if generator is None else generator.device


def uniform_block(size: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    return torch.rand(size, generator=generator, device=device, dtype=torch.float64)
