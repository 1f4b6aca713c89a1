import pytest
import torch

from p2p_diloco.config import CODECS
from p2p_diloco.core import codecs
from p2p_diloco.errors import CodecError


@pytest.mark.parametrize("codec,tol", [("fp32", 0.0), ("bf16", 2**-8), ("fp16", 2**-11), ("int8", 1 / 127)])
def test_roundtrip_error_is_bounded(codec, tol):
    x = torch.randn(10_001, generator=torch.Generator().manual_seed(0))
    y = codecs.decode(codecs.encode(x, codec), x.numel(), codec)
    assert y.dtype == torch.float32 and y.shape == x.shape
    if codec == "int8":  # error bounded by half a quantisation step of each block's scale
        blocks = torch.nn.functional.pad(x, (0, (-x.numel()) % codecs.INT8_BLOCK)).view(-1, codecs.INT8_BLOCK)
        step = (blocks.abs().amax(1) / 127).repeat_interleave(codecs.INT8_BLOCK)[: x.numel()]
        assert ((x - y).abs() <= step / 2 + 1e-7).all()
    else:
        assert ((x - y).abs() <= tol * x.abs() + 1e-12).all()


@pytest.mark.parametrize("codec", CODECS)
def test_sizes_match_encoded_nbytes(codec):
    for n in (0, 1, 255, 256, 257, 4096):
        assert codecs.encode(torch.randn(n), codec).numel() == codecs.encoded_nbytes(n, codec)


def test_int8_is_about_a_quarter_of_fp32():
    n = 1_000_000
    assert codecs.encoded_nbytes(n, "int8") / codecs.encoded_nbytes(n, "fp32") < 0.26


def test_zero_block_decodes_to_zero():
    x = torch.zeros(300)
    assert torch.equal(codecs.roundtrip(x, "int8"), x)


def test_wrong_size_and_unknown_codec_are_clear_errors():
    buf = codecs.encode(torch.randn(100), "bf16")
    with pytest.raises(CodecError, match="must be 200 bytes"):
        codecs.decode(buf[:-2], 100, "bf16")
    with pytest.raises(CodecError, match="unknown codec 'zstd'"):
        codecs.encode(torch.randn(3), "zstd")
    with pytest.raises(CodecError, match="flat float32"):
        codecs.encode(torch.randn(3, 3), "fp32")


def test_decode_accepts_bytes():
    x = torch.randn(513)
    raw = bytes(codecs.encode(x, "int8").numpy().tobytes())
    assert torch.allclose(codecs.decode(raw, 513, "int8"), codecs.roundtrip(x, "int8"))


def test_int4_is_within_half_a_step_and_about_half_of_int8():
    for n in (0, 1, 7, 255, 256, 257, 4099):
        x = torch.randn(n, generator=torch.Generator().manual_seed(n))
        buf = codecs.encode(x, "int4")
        assert buf.dtype == torch.uint8 and buf.numel() == codecs.encoded_nbytes(n, "int4")
        y = codecs.decode(buf, n, "int4")
        assert y.dtype == torch.float32 and y.shape == x.shape
        blocks = torch.nn.functional.pad(x, (0, (-n) % codecs.INT8_BLOCK)).view(-1, codecs.INT8_BLOCK)
        step = (blocks.abs().amax(1) / 7).repeat_interleave(codecs.INT8_BLOCK)[:n]
        assert ((x - y).abs() <= step / 2 + 1e-6).all()
    n = 1_000_000
    assert codecs.encoded_nbytes(n, "int4") / codecs.encoded_nbytes(n, "int8") < 0.52


def test_sign_keeps_the_sign_and_the_blocks_mean_magnitude():
    for n in (1, 7, 255, 256, 257, 4099):
        x = torch.randn(n, generator=torch.Generator().manual_seed(n))
        buf = codecs.encode(x, "sign")
        assert buf.numel() == codecs.encoded_nbytes(n, "sign") == 4 * -(-n // 256) + -(-n // 8)
        y = codecs.decode(buf, n, "sign")
        assert (torch.sign(y) == torch.where(x >= 0, 1.0, -1.0)).all()
        mean_abs = [x[i : i + codecs.INT8_BLOCK].abs().mean() for i in range(0, n, codecs.INT8_BLOCK)]
        assert torch.allclose(y.abs(), torch.stack(mean_abs).repeat_interleave(codecs.INT8_BLOCK)[:n])


@pytest.mark.parametrize("codec", ["int8", "int4", "sign", "bf16"])
def test_slices_of_an_encoded_vector_and_chunked_encoding_match_the_whole(codec):
    """Any slice, odd starts and ends included, decodes bit for bit as the whole does; `encode_into`
    writes, chunk by chunk, what `encode` writes."""
    n = 3 * codecs.INT8_BLOCK + 77
    x = torch.randn(n, generator=torch.Generator().manual_seed(3))
    whole = codecs.encode(x, codec)
    chunked = torch.empty_like(whole)
    codecs.encode_into(chunked, x, codec, chunk=2 * codecs.INT8_BLOCK)
    assert torch.equal(chunked, whole)
    ref, vec = codecs.decode(whole, n, codec), codecs.EncodedVector(whole, codec, n)
    for i, j in [(0, n), (1, 2), (3, 600), (256, 513), (n - 1, n), (700, 700)]:
        assert torch.equal(vec[i:j].float(), ref[i:j]), (i, j)


@pytest.mark.parametrize("n", [1, 7, 255, 256, 257, 3_000_001])
def test_sign_is_encoded_a_chunk_at_a_time_as_one_block_layout(n):
    """`sign` in chunks (no whole-state temporaries): the layout of one pass over padded blocks, bit
    for bit, and `encode_difference` encodes the difference without taking it whole."""
    import math

    from p2p_diloco.core.codecs import INT8_BLOCK, ENCODE_CHUNK, encode_difference

    x = torch.randn(n if n < 3_000_000 else ENCODE_CHUNK * 2 + 13)
    n = x.numel()
    blocks = torch.zeros(math.ceil(n / INT8_BLOCK) * INT8_BLOCK)
    blocks[:n] = x
    blocks = blocks.view(-1, INT8_BLOCK)
    counts = torch.full((blocks.shape[0],), float(INT8_BLOCK))
    counts[-1] = n - (blocks.shape[0] - 1) * INT8_BLOCK
    bits = (blocks >= 0).to(torch.uint8).view(-1)[: -(-n // 8) * 8].view(-1, 8)
    packed = (bits << torch.arange(8, dtype=torch.uint8)).sum(dim=1, dtype=torch.uint8)
    assert torch.equal(codecs.encode(x, "sign"), torch.cat([(blocks.abs().sum(dim=1) / counts).view(torch.uint8), packed]))
    y = torch.randn(n)
    assert torch.equal(encode_difference(x, y, "sign"), codecs.encode(x - y, "sign"))
    assert torch.equal(encode_difference(x, y, "int4"), codecs.encode(x - y, "int4"))
