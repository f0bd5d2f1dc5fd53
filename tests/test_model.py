"""The `.oinf` reader/writer (SPEC §7): real files, byte-exact round trips, every dtype, corrupt input."""
from __future__ import annotations

import json
import random
import struct

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oi2jax import dtypes as dt
from oi2jax.diagnostics import OiError
from oi2jax.model import Meta, MetaValue, ModelError, Tensor, open_model, save
from oi2jax.model import packing
from oi2jax.model.inspect import render_model

from conftest import BASELINE, MODELS, open_everything, rewrite_model as rewrite

REAL_FILES = sorted(MODELS.glob("*.oinf")) + sorted(BASELINE.glob("*.oinf"))
JSON_DTYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "int8": "i8", "int16": "i16",
               "int32": "i32", "int64": "i64", "uint8": "u8", "uint16": "u16", "uint32": "u32",
               "uint64": "u64", "bool": "bool", "bfloat16": "bf16", "float8_e5m2": "f8"}


def _ids(paths):
    return [p.name for p in paths]




def test_real_files_present():
    assert len(list(MODELS.glob("*.oinf"))) == 10
    assert len(list(BASELINE.glob("*.oinf"))) == 12


@pytest.mark.parametrize("path", sorted(BASELINE.glob("*.oinf")), ids=_ids(sorted(BASELINE.glob("*.oinf"))))
def test_baseline_listing_matches(path):
    listing = json.loads(path.with_suffix(".json").read_text())
    m = open_model(path)
    assert m.sizevars == {} and m.metadata == {}
    assert set(m.tensors) == {t["name"] for t in listing["tensors"]}
    for t in listing["tensors"]:
        info = m.tensors[t["name"]]
        assert info.dtype == JSON_DTYPES.get(t["dtype"], t["dtype"])
        assert info.shape == tuple(t["shape"])
        value = m.load(t["name"])
        assert value.shape == tuple(t["shape"])
        assert value.dtype == dt.get(info.dtype).np_dtype


@pytest.mark.parametrize("path", REAL_FILES, ids=_ids(REAL_FILES))
def test_real_file_round_trip_byte_exact(path, tmp_path):
    m = open_model(path)
    for name in m.tensors:
        m.load(name)
    out = tmp_path / "copy.oinf"
    save(out, **rewrite(m))
    assert out.read_bytes() == path.read_bytes()
    assert m.bytes_loaded == sum(i.nbytes for i in m.tensors.values())


def test_example_models_listing():
    m = open_model(MODELS / "residual_mlp_stack.oinf")
    assert m.sizevars == {"B": 4, "D": 32, "num_layers": 3}
    assert sorted(m.tensors) == ["bias0"] + [f"res.mlp.{k}.{i}" for k in "bw" for i in range(3)]
    assert m.tensors["res.mlp.w.1"].shape == (32, 32) and m.tensors["res.mlp.b.2"].shape == (32,)
    m = open_model(MODELS / "linear_attention.oinf")
    assert m.sizevars == {"B": 4, "D": 32, "num_heads": 2}
    assert all(i.dtype == "f32" and i.shape == (32, 32) for i in m.tensors.values())
    m = open_model(MODELS / "cache_window_slice.oinf")
    assert m.sizevars == {"D": 8}
    assert m.tensors["limit"].shape == () and m.load("limit") == 6 and m.load("zero") == 0
    assert m.load("limit").dtype == np.int32


def test_quantized_linear_values():
    m = open_model(MODELS / "quantized_linear.oinf")
    x, w = m.load("x"), m.load("w")
    assert x.dtype == np.int8 and x.shape == (4, 16) and w.shape == (16, 8)
    assert x.reshape(-1)[:4].tolist() == [7, 0, 6, -1]
    assert w.reshape(-1)[:4].tolist() == [-1, 6, -7, 2]
    assert x.min() >= -8 and x.max() <= 7
    raw = m.load_packed("x")
    assert raw.dtype == np.uint8 and raw.shape == (32,)
    assert raw[0] == 0x07 and raw[1] == 0xF6  # 7, 0 -> 0x07; 6, -1 -> 0xF6
    assert np.array_equal(packing.unpack("i4", raw, (4, 16)), x)


def test_packed_baseline_values():
    m = open_model(BASELINE / "ops_packed.oinf")
    assert m.load("packed_i4_x").tolist() == [[-8, -3, 0, 7], [6, -1, -7, 3]]
    assert m.load("packed_u2_x").tolist() == [[0, 1, 2, 3], [3, 2, 1, 0]]
    assert m.load("packed_u2_x").dtype == np.uint8
    assert m.load("packed_i4_argmax_out").reshape(-1).tolist() == [3, 0]
    assert m.load_packed("packed_i4_x").tolist() == [0xD8, 0x70, 0xF6, 0x39]


def test_float_special_dtypes():
    m = open_model(BASELINE / "ops_float_special.oinf")
    assert m.load("bf16_a").dtype == ml_dtypes.bfloat16
    assert m.load("f8_a").dtype == ml_dtypes.float8_e5m2
    assert m.load("f16_a").dtype == np.float16
    # f8 decodes the stored bytes as they are
    assert np.array_equal(m.load("f8_a").view(np.uint8).reshape(-1), m.load_packed("f8_a"))


def test_lazy_and_cached():
    m = open_model(MODELS / "mlp_regression.oinf")
    assert m.bytes_loaded == 0
    a = m.load("w1")
    assert m.bytes_loaded == 16 * 32 * 4
    assert m.load("w1") is a
    assert m.bytes_loaded == 16 * 32 * 4
    assert not a.flags.writeable
    with pytest.raises(ModelError, match="model tensor nope not found"):
        m.load("nope")


# ---------------------------------------------------------------- SPEC §7.8 and §5.1 worked examples

SPEC_EXAMPLE = bytes.fromhex(
    "4f494e4600" "01000000" "00000000" "01000000" "01000000" "01000000" "00000000"
    "4800000000000000" "5800000000000000" "7800000000000000" "a800000000000000" "b800000000000000" "000000"
    "010000004e000000" "0200000000000000"
    "010000006b000000" "03000000" "00000000" "0400000000000000" "a800000000000000"
    "0100000076000000" "0a000000" "01000000" "01000000" "0200000000000000" "0800000000000000"
    "b000000000000000" "00000000"
    "0700000000000000" "0000803f000000c0")


def test_spec_worked_example_bytes(tmp_path):
    assert len(SPEC_EXAMPLE) == 184
    out = tmp_path / "ex.oinf"
    save(out, sizevars={"N": 2}, metadata={"k": Meta("i32", 7)},
         tensors={"v": np.array([1.0, -2.0], np.float32)}, version=1)
    assert out.read_bytes() == SPEC_EXAMPLE
    m = open_model(out)
    assert m.sizevars == {"N": 2}
    assert m.metadata["k"].type == "i32" and m.metadata["k"].value == 7
    assert m.load("v").tolist() == [1.0, -2.0]
    info = m.tensors["v"]
    assert (info.dtype, info.shape, info.has_data, info.nbytes, info.offset) == ("f32", (2,), True, 8, 176)


def test_spec_packed_examples(tmp_path):
    assert packing.pack("i4", np.array([[-1, 2], [7, -8]])).tolist() == [0x2F, 0x87]
    assert packing.pack("i4", [-8, -3, 0, 7]).tolist() == [0xD8, 0x70]
    assert packing.pack("u2", [0, 1, 2, 3]).tolist() == [0xE4]
    assert packing.pack("t1", [-1, 1, 1, -1]).tolist() == [0x06]
    assert packing.unpack("t1", np.array([0x06], np.uint8), (4,)).tolist() == [-1, 1, 1, -1]
    assert packing.pack("u1", [1, 0, 1]).tolist() == [0b101]
    out = tmp_path / "q.oinf"
    save(out, tensors={"q": Tensor("i4", np.array([[-1, 2], [7, -8]], np.int8))}, version=1)
    m = open_model(out)
    assert m.tensors["q"].nbytes == 2 and m.load_packed("q").tolist() == [0x2F, 0x87]
    assert m.load("q").tolist() == [[-1, 2], [7, -8]]


def test_writer_metadata_inference(tmp_path):
    out = tmp_path / "m.oinf"
    save(out, metadata={"a": 3, "b": 300, "c": -1, "d": -40000, "e": 1.5, "f": "hello world", "g": True,
                        "h": np.int16(-2), "i": np.arange(6, dtype=np.float32).reshape(2, 3),
                        "j": Meta("bitset", np.array([1, 0, 1, 1, 0, 0, 0, 0, 1], bool)),
                        "k": Meta("ndarray", np.array([-8, 7, 1], np.int8), elem="i4"),
                        "l": 1 << 40, "m": Meta("t1", -1), "n": np.float64(2.5), "o": Meta("bf16", 1.5)})
    md = open_model(out).metadata
    assert {k: v.type for k, v in md.items()} == {
        "a": "u8", "b": "u16", "c": "i8", "d": "i32", "e": "f32", "f": "string", "g": "bool", "h": "i16",
        "i": "ndarray", "j": "bitset", "k": "ndarray", "l": "u64", "m": "t1", "n": "f64", "o": "bf16"}
    assert md["b"].value == 300 and md["d"].value == -40000 and md["e"].value == 1.5
    assert md["f"].value == "hello world" and md["g"].value is np.True_
    assert md["i"].elem == "f32" and md["i"].value.shape == (2, 3) and md["i"].value[1, 2] == 5
    assert md["j"].value.tolist() == [True, False, True, True, False, False, False, False, True]
    assert md["k"].elem == "i4" and md["k"].value.tolist() == [-8, 7, 1]
    assert md["m"].value == -1 and md["o"].value == 1.5


def test_writer_keeps_what_its_dtype_holds(tmp_path):
    """What a float dtype holds is stored rounded, and non-finite values as given: 1e-5 as
    f32(1e-5), a NaN or infinity as itself, a tiny tensor value (not metadata) rounded to 0, and
    Meta('f64', 1e-50) exactly."""
    save(tmp_path / "m.oinf", metadata={"a": 1e-5, "b": float("nan"), "c": -np.inf, "d": -0.0, "e": Meta("f64", 1e-50)},
         tensors={"w": Tensor("f16", np.array([1e-10, np.inf, np.nan, 65504.0])),
                  "x": Tensor("f32", np.array([1e-50, 0.1]))})
    model = open_model(tmp_path / "m.oinf")
    md = model.metadata
    assert md["a"].value == np.float32(1e-5) and np.isnan(md["b"].value) and md["c"].value == -np.inf
    assert np.signbit(md["d"].value) and md["e"] == MetaValue("f64", 1e-50)
    np.testing.assert_array_equal(model.load("w"), np.array([0, np.inf, np.nan, 65504], np.float16))
    assert model.load("x").tolist() == [0.0, float(np.float32(0.1))]


@pytest.mark.parametrize("kwargs, message", [
    (dict(tensors={"W[0]": np.zeros(1, np.float32)}), "invalid name"),
    (dict(tensors={"": np.zeros(1, np.float32)}), "invalid name"),
    (dict(sizevars={"a b": 1}), "invalid name"),
    (dict(metadata={"é": 1}), "invalid name"),
    (dict(tensors={"q": Tensor("i4", np.array([8]))}), "out of range for i4"),
    (dict(tensors={"q": Tensor("u2", np.array([-1]))}), "out of range for u2"),
    (dict(tensors={"q": Tensor("t1", np.array([0]))}), "out of range for t1"),
    (dict(tensors={"q": Tensor("u8", np.array([256]))}), "out of range for u8"),
    (dict(tensors={"q": Tensor("i4", np.array([0.5]))}), "must be integers"),
    (dict(tensors={"q": Tensor("x9", np.array([0]))}), "unknown dtype"),
    (dict(tensors={"q": np.zeros(2, np.complex64)}), "no OpenInfer dtype"),
    (dict(tensors={"q": [1, 2]}), "expected a NumPy array"),
    (dict(sizevars={"N": -1}), "out of range"),
    (dict(sizevars={"N": 1.5}), "must be an integer"),
    (dict(metadata={"k": 1 << 64}), "does not fit"),
    (dict(metadata={"k": object()}), "unsupported metadata"),
    (dict(metadata={"k": Meta("string", 3)}), "needs a str"),
    # a finite float stored as a dtype it overflows: an error, never an infinity in its place
    (dict(tensors={"q": Tensor("f16", np.array([1.0, 70000.0, -80000.0]))}),
     r"tensor q: value 80000 overflows f16 \(largest finite 65504\)"),
    (dict(tensors={"q": Tensor("f16", np.array([70000], np.int64))}), "value 70000 overflows f16"),
    (dict(tensors={"q": Tensor("bf16", np.array([1e39]))}), r"value 1e\+39 overflows bf16"),
    (dict(tensors={"q": Tensor("f8", np.array([1e6], np.float32))}), r"value 1e\+06 overflows f8 \(largest finite 57344\)"),
    (dict(tensors={"q": Tensor("f32", np.array([1e300]))}), r"value 1e\+300 overflows f32"),
    (dict(metadata={"eps": 1e300}), r"metadata eps: value 1e\+300 overflows f32"),
    # a Python float is stored as f32: one f32 holds only as 0 is an error, not a 0
    (dict(metadata={"eps": 1e-50}), r"metadata eps: value 1e-50 is 0 in f32, in which the file would hold it "
                                    r"\(give Meta\('f64', value\) to keep it\)"),
    (dict(metadata={"eps": Meta("f16", -1e-9)}), r"value -1e-09 is 0 in f16"),
])
def test_writer_rejects(tmp_path, kwargs, message):
    with pytest.raises(ModelError, match=message) as exc:
        save(tmp_path / "bad.oinf", **kwargs)
    assert isinstance(exc.value, OiError)
    assert str(tmp_path / "bad.oinf") in str(exc.value)


def test_no_data_tensor(tmp_path):
    out = tmp_path / "nd.oinf"
    save(out, tensors={"decl": Tensor("f16", None, shape=(3, 1 << 40)), "v": np.ones(3, np.float32)})
    m = open_model(out)
    info = m.tensors["decl"]
    assert not info.has_data and info.nbytes == 0 and info.offset == 0 and info.shape == (3, 1 << 40)
    with pytest.raises(ModelError, match="has no data"):
        m.load("decl")
    save(tmp_path / "again.oinf", **rewrite(m))
    assert (tmp_path / "again.oinf").read_bytes() == out.read_bytes()


# ---------------------------------------------------------------- property: writer -> reader round trip

_NAMES = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=12)


def _values_for(dtype: str, shape, rng: np.random.Generator) -> np.ndarray:
    d = dt.get(dtype)
    n = int(np.prod(shape)) if shape else 1
    if d.is_float:
        if dtype == "f8":
            vals = rng.integers(0, 256, n).astype(np.uint8).view(ml_dtypes.float8_e5m2)
        elif dtype == "bf16":
            vals = rng.integers(0, 1 << 16, n).astype(np.uint16).view(ml_dtypes.bfloat16)
        else:
            width = d.bits // 8
            vals = rng.integers(0, 256, n * width).astype(np.uint8).view(d.np_dtype)
        return vals.reshape(shape)
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(bool).reshape(shape)
    if dtype == "t1":
        return rng.choice(np.array([-1, 1], np.int8), n).reshape(shape)
    if d.bits == 64:
        return rng.integers(0, 256, n * 8).astype(np.uint8).view(d.np_dtype).reshape(shape)
    lo, hi = int(d.min), int(d.max)
    return rng.integers(lo, hi, n, endpoint=True, dtype=np.int64).astype(d.np_dtype).reshape(shape)


@st.composite
def model_contents(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    sizevars = draw(st.dictionaries(_NAMES, st.integers(0, 2 ** 64 - 1), max_size=4))
    tensors = {}
    for name in draw(st.lists(_NAMES, max_size=6, unique=True)):
        dtype = draw(st.sampled_from(sorted(dt.DTYPES)))
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
        if draw(st.integers(0, 9)) == 0:
            tensors[name] = Tensor(dtype, None, shape=shape)
        else:
            tensors[name] = Tensor(dtype, _values_for(dtype, shape, rng))
    metadata = {}
    for key in draw(st.lists(_NAMES, max_size=6, unique=True)):
        kind = draw(st.sampled_from(["scalar", "string", "bitset", "ndarray", "int", "float"]))
        if kind == "scalar":
            dtype = draw(st.sampled_from(sorted(n for n in dt.DTYPES if n != "bitset")))
            metadata[key] = Meta(dtype, _values_for(dtype, (), rng)[()])
        elif kind == "string":
            metadata[key] = draw(st.text(max_size=20))
        elif kind == "bitset":
            metadata[key] = Meta("bitset", rng.integers(0, 2, draw(st.integers(0, 20))).astype(bool))
        elif kind == "ndarray":
            dtype = draw(st.sampled_from(sorted(n for n in dt.DTYPES if n != "bitset")))
            shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
            metadata[key] = Meta("ndarray", _values_for(dtype, shape, rng), elem=dtype)
        elif kind == "int":
            metadata[key] = draw(st.integers(-(2 ** 63), 2 ** 64 - 1))
        else:
            metadata[key] = draw(st.floats(width=32))
    return sizevars, metadata, tensors


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model_contents())
def test_property_round_trip(tmp_path, contents):
    sizevars, metadata, tensors = contents
    out = tmp_path / "p.oinf"
    save(out, sizevars=sizevars, metadata=metadata, tensors=tensors)
    m = open_model(out)
    assert m.sizevars == sizevars
    assert set(m.metadata) == set(metadata)
    for key, v in metadata.items():
        got = m.metadata[key]
        if isinstance(v, MetaValue):
            if v.type == "bool" or v.type == "bitset" or (v.type == "ndarray" and v.elem == "bool"):
                assert got.type == v.type
                assert np.array_equal(np.asarray(got.value), np.asarray(v.value).astype(bool))
            else:
                assert got == v, key
        elif isinstance(v, str):
            assert got == MetaValue("string", v)
        elif isinstance(v, float):
            assert got.type == "f32"
            assert np.float32(v).tobytes() == np.asarray(got.value).tobytes()
        else:
            assert int(got.value) == v and got.type[0] == ("i" if v < 0 else "u")
    assert set(m.tensors) == set(tensors)
    for name, t in tensors.items():
        info = m.tensors[name]
        assert info.dtype == t.dtype
        if t.data is None:
            assert not info.has_data and info.shape == tuple(t.shape)
            continue
        got = m.load(name)
        assert got.dtype == dt.get(t.dtype).np_dtype and got.shape == t.data.shape
        assert got.tobytes() == np.asarray(t.data).tobytes()
    # and back again, byte for byte
    save(tmp_path / "p2.oinf", **rewrite(m))
    assert (tmp_path / "p2.oinf").read_bytes() == out.read_bytes()


# ---------------------------------------------------------------- corrupt input

def _patched(tmp_path, data: bytes, name="bad.oinf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _set(data: bytes, offset: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


EX = SPEC_EXAMPLE


@pytest.mark.parametrize("data, message", [
    (b"", "file too small for OINF header: 0 bytes, need 69"),  # Rust texts first (D10)
    (EX[:60], "file too small for OINF header: 60 bytes"),
    (EX[:100], "file size mismatch: header file_size"),
    (b"XINF\x00" + EX[5:], "invalid OINF magic: not an .oinf file \\(bad magic 58"),
    (_set(EX, 5, "<I", 3), "unsupported OINF version 3"),
    (_set(EX, 5, "<I", 0), "unsupported OINF version 0"),
    (_set(EX, 0x88, "<I", 3), "tensor flags contain unsupported bits for v"),  # v1 has no HAS_QUANT
    (_set(EX, 61, "<Q", 999), "does not match the file length"),
    (_set(EX, 53, "<Q", 1000), "offset_data 1000 is after file_size"),
    (_set(EX, 37, "<Q", 200), "OINF offsets are not ascending: offset_metadata 200 is after offset_tensors"),
    (_set(EX, 45, "<Q", 124), "OINF section offset not aligned: offset_tensors 124 is not a multiple of 8"),
    (_set(EX, 29, "<Q", 0), "points into the header"),
    (_set(EX, 13, "<I", 0xFFFFFFFF), "sizevar table: 4294967295 entries cannot fit"),
    (_set(EX, 21, "<I", 1000), "tensor table: 1000 entries cannot fit"),
    (_set(EX, 0x48, "<I", 1000), "runs past the end"),
    (_set(EX, 0x4C, "<B", 0xFF), "not ASCII"),
    (_set(EX, 0x4C, "<B", ord("[")), "invalid name"),
    (_set(EX, 0x60, "<I", 99), "unknown value type 99"),
    (_set(EX, 0x64, "<I", 1), "flags must be 0"),
    (_set(EX, 0x68, "<Q", 8), "i32 value needs 4 bytes"),
    (_set(EX, 0x70, "<Q", 0xa9), "not a multiple of 8"),
    (_set(EX, 0x70, "<Q", 0x50), "outside the data section"),
    (_set(EX, 0x70, "<Q", 0xb8), "outside the data section"),
    (_set(EX, 0x80, "<I", 14), "unknown tensor dtype 14"),
    (_set(EX, 0x80, "<I", 26), "unknown tensor dtype 26"),
    (_set(EX, 0x84, "<I", 0x40000000), "dims run past the end"),
    (_set(EX, 0x8c, "<Q", 3), "byte length mismatch"),
    (_set(EX, 0x8c, "<Q", 1 << 62), "absurdly large|byte length mismatch"),
    (_set(EX, 0x94, "<Q", 1 << 63), "outside the data section"),
    (_set(EX, 0x9c, "<Q", 0xa8), "overlaps"),
    (_set(EX, 0x9c, "<Q", 0xb4), "not a multiple of 8"),
    (_set(EX, 0x9c, "<Q", 0xb8), "outside the data section"),
    (_set(EX, 0x88, "<I", 0), "tensor without data must have zero offset/size"),
    (_set(EX, 0x4C, "<B", ord("k")), None),  # sizevar renamed "k": fine (separate namespaces)
])
def test_corrupt_header_and_tables(tmp_path, data, message):
    p = _patched(tmp_path, data)
    if message is None:
        assert open_model(p).sizevars == {"k": 2}
        return
    with pytest.raises(ModelError, match=message) as exc:
        open_model(p)
    assert exc.value.diagnostics[0].message.startswith(f"{p}: ")
    assert exc.value.render() == f"error: {p}: {exc.value.reason}"


def test_duplicate_names(tmp_path):
    # two tensors both named "a": write "a" and "b", then rename b -> a in the table
    save(tmp_path / "two.oinf", tensors={"a": np.zeros(1, np.float32), "b": np.ones(1, np.float32)})
    data = (tmp_path / "two.oinf").read_bytes()
    i = data.index(b"\x01\x00\x00\x00b")
    bad = data[:i + 4] + b"a" + data[i + 5:]
    with pytest.raises(ModelError, match="duplicate tensor a"):
        open_model(_patched(tmp_path, bad))
    save(tmp_path / "sv.oinf", sizevars={"a": 1, "b": 2})
    data = (tmp_path / "sv.oinf").read_bytes()
    i = data.index(b"\x01\x00\x00\x00b")
    with pytest.raises(ModelError, match="duplicate sizevar a"):
        open_model(_patched(tmp_path, data[:i + 4] + b"a" + data[i + 5:]))
    save(tmp_path / "md.oinf", metadata={"a": 1, "b": 2})
    data = (tmp_path / "md.oinf").read_bytes()
    i = data.index(b"\x01\x00\x00\x00b")
    with pytest.raises(ModelError, match="duplicate metadata key a"):
        open_model(_patched(tmp_path, data[:i + 4] + b"a" + data[i + 5:]))


def test_bad_metadata_payloads(tmp_path):
    save(tmp_path / "s.oinf", metadata={"s": "abc"})
    data = (tmp_path / "s.oinf").read_bytes()
    off = struct.unpack_from("<Q", data, 53)[0]
    with pytest.raises(ModelError, match="string of length 100"):
        open_model(_patched(tmp_path, _set(data, off, "<I", 100)))
    with pytest.raises(ModelError, match="not valid UTF-8"):
        open_model(_patched(tmp_path, _set(data, off + 4, "<B", 0xFF)))
    save(tmp_path / "b.oinf", metadata={"b": Meta("bitset", np.ones(3, bool))})
    data = (tmp_path / "b.oinf").read_bytes()
    off = struct.unpack_from("<Q", data, 53)[0]
    with pytest.raises(ModelError, match="byte_count"):
        open_model(_patched(tmp_path, _set(data, off + 4, "<I", 2)))
    save(tmp_path / "n.oinf", metadata={"n": np.arange(3, dtype=np.int16)})
    data = (tmp_path / "n.oinf").read_bytes()
    off = struct.unpack_from("<Q", data, 53)[0]
    with pytest.raises(ModelError, match="not a scalar type"):
        open_model(_patched(tmp_path, _set(data, off, "<I", 15)))
    with pytest.raises(ModelError, match="does not fit|needs"):
        open_model(_patched(tmp_path, _set(data, off + 8, "<Q", 1 << 60)))
    with pytest.raises(ModelError, match="does not fit"):
        open_model(_patched(tmp_path, _set(data, off + 4, "<I", 1000)))


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ModelError, match="model file not found"):
        open_model(tmp_path / "nope.oinf")
    with pytest.raises(ModelError, match="directory"):
        open_model(tmp_path)


FUZZ_FILES = sorted(set(REAL_FILES[::2]) | {MODELS / "quantized_linear.oinf", BASELINE / "ops_float_special.oinf"})


@pytest.mark.parametrize("path", FUZZ_FILES, ids=_ids(FUZZ_FILES))
def test_fuzz_truncation_and_bitflips(path, tmp_path):
    data = path.read_bytes()
    rng = random.Random(path.name)
    target = tmp_path / "fuzz.oinf"
    cuts = sorted(set([0, 1, 68, 69, 72, len(data) - 1] + [rng.randrange(len(data)) for _ in range(30)]))
    for cut in cuts:
        target.write_bytes(data[:cut])
        assert open_everything(target) is False
    table_end = struct.unpack_from("<Q", data, 53)[0]
    opened = 0
    for i in range(300):
        b = bytearray(data)
        # mostly flip bits in the header/tables, where they matter
        pos = rng.randrange(table_end) if i % 4 else rng.randrange(len(data))
        b[pos] ^= 1 << rng.randrange(8)
        if i % 5 == 0:
            pos2 = rng.randrange(table_end)
            b[pos2] = rng.randrange(256)
        target.write_bytes(bytes(b))
        opened += open_everything(target)
    assert opened > 0  # e.g. flips inside tensor data still open and load


# ---------------------------------------------------------------- big sparse model

def _entry(name: str, code: int, dims, nbytes: int, offset: int) -> bytes:
    raw = name.encode()
    s = struct.pack("<I", len(raw)) + raw
    s += b"\x00" * (-len(s) % 8)
    return s + struct.pack(f"<III{len(dims)}QQQ", code, len(dims), 1, *dims, nbytes, offset)


def test_sparse_2gb_model_opens_lazily(tmp_path):
    big_shape = (1 << 19, 1 << 10)  # f32: 2 GiB
    big_bytes = 4 * big_shape[0] * big_shape[1]
    small = np.arange(4, dtype=np.float32)
    table_len = len(_entry("big", 10, big_shape, 0, 0)) + len(_entry("small", 10, (4,), 0, 0))
    off_data = 72 + (table_len + 7) // 8 * 8
    big_off, small_off = off_data, off_data + big_bytes
    file_size = small_off + 16
    table = _entry("big", 10, big_shape, big_bytes, big_off) + _entry("small", 10, (4,), 16, small_off)
    header = struct.pack("<5sIIIIIIQQQQQ", b"OINF\x00", 1, 0, 0, 0, 2, 0, 72, 72, 72, off_data, file_size)
    p = tmp_path / "big.oinf"
    with open(p, "wb") as f:
        f.write(header + b"\x00" * 3 + table)
        f.truncate(big_off + big_bytes)  # a hole: costs no disk and no time
        f.seek(small_off)
        f.write(small.tobytes())
    assert p.stat().st_size == file_size
    m = open_model(p)
    assert m.tensors["big"].nbytes == big_bytes and m.tensors["big"].has_data
    assert m.tensors["big"].shape == big_shape
    assert m.bytes_loaded == 0
    assert m.load("small").tolist() == [0.0, 1.0, 2.0, 3.0]
    assert m.bytes_loaded == 16
    assert "big" in render_model(m) and m.bytes_loaded == 16
    m.close()


def test_inspect_table():
    m = open_model(MODELS / "quantized_linear.oinf")
    text = render_model(m)
    assert "quantized_linear.oinf" in text
    for word in ("B", "D", "O", "x", "w", "i4", "[4, 16]", "[16, 8]", "32"):
        assert word in text
    assert m.bytes_loaded == 0  # inspect reads only the tables


def test_inspect_metadata(tmp_path):
    p = tmp_path / "meta.oinf"
    save(p, sizevars={"N": 2}, metadata={"k": Meta("i32", 7), "s": "hi", "arr": np.zeros((2, 2), np.float32),
                                         "bits": Meta("bitset", np.array([1, 0, 1], bool))},
         tensors={"v": np.array([1.0, -2.0], np.float32), "nd": Tensor("u4", None, shape=(3,))})
    text = render_model(open_model(p))
    for word in ("N", "2", "k", "i32", "7", "s", "string", "'hi'", "arr", "ndarray", "f32[2, 2]", "bits",
                 "bitset", "101", "v", "f32", "[2]", "8", "nd", "u4", "no data"):
        assert word in text, word


def test_inspect_shows_damaged_special_ids_as_they_are(tmp_path):
    """A tokenizer.bos_id of another type than an integer (a string, a float) made `oi2jax inspect` an
    internal error (int('abc')); it is shown as stored, marked."""
    p = tmp_path / "m.oinf"
    save(p, metadata={"tokenizer.bos_id": "abc", "tokenizer.eos_id": Meta("f32", np.float32(1.5)),
                      "tokenizer.stop_ids": np.array([3, 4], np.int32)}, tensors={"w": np.zeros(1, np.float32)})
    assert "special ids: bos 'abc' (not a token id); eos 1.5 (not a token id); stop 3, 4" in render_model(open_model(p))


def test_empty_ggml_blocks_load_as_empty_values(tmp_path):
    """Kept GGML blocks of a tensor with a dim of 0 were a ValueError of gguf.quants (it cannot reshape
    an empty array) on `Model.load`, so `run --interpret` failed with an internal error."""
    p = tmp_path / "m.oinf"
    save(p, metadata={"ggml_type.a": "Q8_0", "ggml_type.b": "Q4_K", "ggml_type.c": "Q8_0"},
         tensors={"a": Tensor("u8", np.zeros((3, 0), np.uint8)), "b": Tensor("u8", np.zeros((0,), np.uint8)),
                  "c": Tensor("u8", np.zeros((0, 34), np.uint8))})
    m = open_model(p)
    for name, shape in (("a", (3, 0)), ("b", (0,)), ("c", (0, 32))):
        value = m.load(name)
        assert value.shape == shape and value.dtype == np.float32, name
