"""``loaders.canonical.dtype_bytes``: every dtype a reader can report, and a clear refusal otherwise."""
import pytest
import torch

from loaders.canonical import dtype_bytes


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16,
                                   torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                                   torch.float8_e5m2fnuz, torch.float8_e8m0fnu, torch.int64, torch.int32,
                                   torch.int16, torch.int8, torch.uint64, torch.uint32, torch.uint16, torch.uint8,
                                   torch.bool, torch.complex64, torch.complex128])
def test_matches_torch_itemsize(dtype):
    assert dtype_bytes(str(dtype)) == dtype.itemsize
    assert dtype_bytes(str(dtype).replace("torch.", "")) == dtype.itemsize


def test_unknown_dtype_is_refused_not_guessed():
    with pytest.raises(ValueError, match=r"^unknown dtype 'int4': expected one of float64, float32, "):
        dtype_bytes("int4")
