"""The quantisers' reused temporaries: one storage per slot and thread, grown when a
larger operand comes, usable after inference mode; and the quantisers that compute in
them (``into=``) or in the operand they are given up (``overwrite=``) give the same bits as
a quantiser that makes new tensors."""
from __future__ import annotations

import math
import threading

import pytest
import torch

from amptrain.precision.lowbit_formats import qdq_mx, qdq_nvfp4
from amptrain.precision.lowbit_scratch import release, scratch


def test_a_slot_reuses_its_storage_and_grows_for_a_larger_operand():
    release()
    first = scratch("t", (4, 8), torch.float32, torch.device("cpu"))
    again = scratch("t", (8, 4), torch.float32, torch.device("cpu"))
    assert again.data_ptr() == first.data_ptr() and again.shape == (8, 4)
    other = scratch("u", (4, 8), torch.float32, torch.device("cpu"))
    assert other.data_ptr() != first.data_ptr()
    grown = scratch("t", (64, 8), torch.float32, torch.device("cpu"))
    assert grown.numel() == 512 and grown.is_contiguous()
    assert scratch("t", (4, 8), torch.float32, torch.device("cpu")).data_ptr() == \
        grown.data_ptr()                                  # the old views are dropped
    release()


def test_each_thread_has_its_own_slots():
    release()
    mine = scratch("t", (16,), torch.float32, torch.device("cpu")).data_ptr()
    theirs = []
    thread = threading.Thread(target=lambda: theirs.append(
        scratch("t", (16,), torch.float32, torch.device("cpu")).data_ptr()))
    thread.start()
    thread.join()
    assert theirs[0] != mine
    release()


def test_a_slot_first_taken_in_inference_mode_is_writable_outside_it():
    release()
    with torch.inference_mode():
        qdq_nvfp4(torch.randn(32, 64), into="q")        # the slots made in inference mode
    outside = torch.randn(32, 64)                       # written outside it: no error
    assert torch.equal(qdq_nvfp4(outside, into="q"), qdq_nvfp4(outside))
    release()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.nan_to_num(0.0).view(torch.int32)


@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("stochastic", [False, True])
def test_quantising_in_reused_or_given_up_storage_gives_the_same_bits(dim, stochastic):
    torch.manual_seed(0)
    x = torch.randn(48, 64) * torch.logspace(-20, 20, 64)
    flat = x.view(-1)
    flat[::97], flat[5::101], flat[7::89], flat[9::83] = math.nan, math.inf, 0.0, -0.0

    def quantise(t: torch.Tensor, **where: object) -> torch.Tensor:
        gen = torch.Generator().manual_seed(3)
        return qdq_nvfp4(t, dim, generator=gen, stochastic=stochastic, **where)

    fresh = quantise(x)
    into = quantise(x, into="q")
    given = x.clone()
    overwritten = quantise(given, overwrite=True)
    assert overwritten.data_ptr() == given.data_ptr()     # the result in x's storage
    for got in (into, overwritten):
        assert torch.equal(fresh.isnan(), got.isnan())
        assert torch.equal(_bits(fresh), _bits(got))
    # MX likewise
    mx = qdq_mx(x, "e2m1", dim)
    assert torch.equal(_bits(mx), _bits(qdq_mx(x, "e2m1", dim, into="q")))
    assert torch.equal(_bits(mx), _bits(qdq_mx(x.clone(), "e2m1", dim, overwrite=True)))


def test_a_quantiser_that_autograd_records_makes_new_tensors():
    x = torch.randn(32, 32, requires_grad=True)
    out = qdq_nvfp4(x, into="q")
    assert out.requires_grad
    assert torch.equal(out.detach(), qdq_nvfp4(x.detach()))
