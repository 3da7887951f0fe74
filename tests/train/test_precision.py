"""The trainers' --device / --dtype options: checks, autocast over float32 weights, the loss scaler."""

from __future__ import annotations

import argparse

import pytest
import torch

from specfamily.train.precision import (
    Precision,
    check_device,
    check_dtype,
    concrete_device,
    device_arg,
    optimizer_step,
    resolve_device,
)


@pytest.mark.parametrize("text", ["cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_names_accepted(text):
    assert check_device(text) == text


@pytest.mark.parametrize("text", ["gpu", "cuda:", "cuda:x", "mps", "CPU", "cuda:0 ", ""])
def test_device_names_refused_with_what_is_allowed(text):
    with pytest.raises(ValueError, match=r"device must be 'cpu', 'cuda' or 'cuda:N'"):
        check_device(text)
    with pytest.raises(argparse.ArgumentTypeError, match="device must be"):
        device_arg(text)


def test_dtypes():
    assert [check_dtype(d) for d in ("float32", "bfloat16", "float16")] == ["float32", "bfloat16", "float16"]
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16, got 'half'"):
        check_dtype("half")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="--device cuda:1: CUDA is not available on this machine"):
        resolve_device("cuda:1")
    with pytest.raises(ValueError, match="CUDA is not available"):
        Precision.of("cuda", "bfloat16")


def test_float32_is_the_plain_path():
    precision = Precision.of("cpu", "float32")
    assert precision == Precision(torch.device("cpu"), torch.float32) and not precision.mixed
    with precision.autocast():
        assert not torch.is_autocast_enabled("cpu")
    assert not precision.scaler().is_enabled()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_autocasts_and_scales_float16_only(dtype):
    precision = Precision.of("cpu", dtype)
    layer = torch.nn.Linear(4, 4)
    with precision.autocast():
        assert torch.is_autocast_enabled("cpu")
        assert layer(torch.randn(2, 4)).dtype == getattr(torch, dtype)
    assert layer.weight.dtype == torch.float32
    assert precision.scaler().is_enabled() == (dtype == "float16")


def _trained(dtype: str | None, steps: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for _ in range(steps):
        if dtype is None:  # the sequence the trainers ran before
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
        else:
            precision = Precision.of("cpu", dtype)
            with precision.autocast():
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            assert torch.isfinite(loss)
            optimizer_step(loss, optimizer, model.parameters(), 0.5, precision.scaler())
    return model


def test_float32_optimizer_step_is_the_old_sequence_exactly():
    old, new = _trained(None), _trained("float32")
    assert all(torch.equal(a, b) for a, b in zip(old.parameters(), new.parameters(), strict=True))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_steps_train_float32_weights(dtype):
    start, reference, trained = _trained(None, steps=0), _trained(None), _trained(dtype)
    for a, b, c in zip(start.parameters(), reference.parameters(), trained.parameters(), strict=True):
        assert c.dtype == torch.float32 and torch.isfinite(c).all() and not torch.equal(a, c)  # it trained
        assert torch.allclose(b, c, atol=0.01)  # as the float32 run did, up to 16-bit rounding


def test_auto_is_a_gpu_in_bfloat16_when_there_is_one_else_the_cpu_in_float32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = Precision.of("auto", "auto")
    assert (cpu.device, cpu.dtype, cpu.frozen_dtype) == (torch.device("cpu"), torch.float32, torch.float32)
    assert concrete_device("auto") == "cpu" and concrete_device("cuda:1") == "cuda:1"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert concrete_device("auto") == "cuda"
    assert Precision(torch.device("cuda", 0), torch.bfloat16).frozen_dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"dtype must be one of float32, bfloat16, float16, got 'half' \(or 'auto'"):
        check_dtype("half")
