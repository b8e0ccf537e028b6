"""The Python copy of the intake wire format (sparsync/_wire.py) and the ctypes structs of the
client binding (sparsync/_client.py) against the C headers they mirror.

wire.h and client.h are parsed here: every #define, enum value, dtype size and struct layout
(field names, order, offsets, sizes; the C layout computed with ctypes, i.e. this platform's
ABI) must be in Python with the same value, and Python must hold nothing wire.h lacks. Needs no
build.
"""

import ctypes
import re

import pytest
from conftest import REPO

from sparsync import _client
from sparsync import _wire as W

WIRE_H = REPO / "proto" / "intake" / "wire.h"
CLIENT_H = REPO / "shims" / "client" / "include" / "sparsync" / "client.h"

SCALARS = {"uint8_t": ctypes.c_uint8, "uint16_t": ctypes.c_uint16, "uint32_t": ctypes.c_uint32,
           "int32_t": ctypes.c_int32, "uint64_t": ctypes.c_uint64, "int64_t": ctypes.c_int64,
           "char": ctypes.c_char, "float": ctypes.c_float, "double": ctypes.c_double}


def without_comments(text):
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL))


class Header:
    """What a C header declares: #define'd numbers, enumerators, enum types and structs.
    `included`: a Header of a file this one includes (its enum types and structs are known)."""

    def __init__(self, path, included=None):
        self.text = without_comments(path.read_text())
        self.defines = {m[0]: int(m[1], 0) for m in re.findall(
            r"^#define\s+SPARSYNC_(\w+)\s+(0x[0-9a-fA-F]+|\d+)u?\b", self.text, re.MULTILINE)}
        self.enums = {}
        self.enum_types = set(included.enum_types) if included else set()
        for name, body in re.findall(r"typedef enum (\w+) \{(.*?)\} \1;", self.text, re.DOTALL):
            self.enum_types.add(name)
            for key, value in re.findall(r"SPARSYNC_(\w+)\s*=\s*(\d+)", body):
                self.enums[key] = int(value)
        self.structs = {}  # name -> ctypes.Structure with the C layout
        types = dict(included.structs) if included else {}
        for name, body in re.findall(r"typedef struct (\w+) \{(.*?)\} \1;", self.text, re.DOTALL):
            fields = []
            for ctype, pointer, field, dim in re.findall(
                    r"(?:const\s+)?(\w+)\s*(\*?)\s*(\w+)(?:\[(\w+)\])?;", body):
                if pointer:
                    t = ctypes.c_void_p
                elif ctype in self.enum_types:
                    t = ctypes.c_int
                else:
                    t = SCALARS.get(ctype) or types[ctype]
                if dim:
                    t = t * (int(dim) if dim.isdigit() else self.defines[dim[len("SPARSYNC_"):]])
                fields.append((field, t))
            types[name] = self.structs[name] = type(name, (ctypes.Structure,),
                                                    {"_fields_": fields})
        self.asserted_sizes = {m[0]: int(m[1]) for m in re.findall(
            r"static_assert\(sizeof\((\w+)\) == (\d+)", self.text)}

    def dtype_sizes(self):
        """{dtype value: bytes} from the switch of sparsync_dtype_size."""
        body = re.search(r"sparsync_dtype_size\(.*?\{(.*?)\n\}", self.text, re.DOTALL).group(1)
        sizes = {}
        for cases, size in re.findall(r"((?:case SPARSYNC_\w+:\s*)+)return (\d+);", body):
            for name in re.findall(r"SPARSYNC_(\w+)", cases):
                sizes[self.enums[name]] = int(size)
        return sizes


def layout(structure):
    """[(field, offset, size)] of a ctypes structure."""
    return [(f, getattr(structure, f).offset, getattr(structure, f).size)
            for f, _ in structure._fields_]


@pytest.fixture(scope="module")
def wire():
    return Header(WIRE_H)


def test_the_parser_sees_the_whole_header(wire):
    # Guards the parser: a header it misread would make the comparisons below vacuous.
    assert len(wire.defines) >= 10 and len(wire.enums) >= 40 and len(wire.structs) >= 9
    assert wire.asserted_sizes and set(wire.asserted_sizes) <= set(wire.structs)
    for name, size in wire.asserted_sizes.items():
        assert ctypes.sizeof(wire.structs[name]) == size, name


def test_every_define_and_enum_value_is_in_python(wire):
    c_values = {**wire.defines, **wire.enums}
    assert not set(wire.defines) & set(wire.enums)
    missing = sorted(k for k in c_values if not hasattr(W, k))
    assert not missing, f"in wire.h but not in sparsync/_wire.py: {missing}"
    wrong = {k: (v, getattr(W, k)) for k, v in c_values.items() if getattr(W, k) != v}
    assert not wrong, f"wire.h value, _wire.py value: {wrong}"


def test_python_has_no_constant_that_wire_h_lacks(wire):
    c_names = set(wire.defines) | set(wire.enums)
    python = {k for k, v in vars(W).items()
              if k.isupper() and type(v) is int and not k.startswith("_")}
    assert python - c_names == set(), "in _wire.py but not in wire.h"


def test_dtype_sizes(wire):
    sizes = wire.dtype_sizes()
    assert set(sizes) == set(range(wire.enums["DTYPE_COUNT"]))
    assert W.ITEMSIZE == sizes


def test_derived_tables_cover_every_value(wire):
    assert W.COMPRESSORS == {k[len("COMPRESSOR_"):].lower(): v for k, v in wire.enums.items()
                             if k.startswith("COMPRESSOR_") and k != "COMPRESSOR_COUNT"}
    statuses = {v for k, v in wire.enums.items() if k == "OK" or k.startswith("ERR_")}
    assert set(W.STATUS_NAMES) == statuses
    assert {m.msg_type for m in W.LAYOUTS if m.msg_type is not None} == {
        v for k, v in wire.enums.items() if k.startswith("MSG_")}


def test_every_struct_has_the_c_layout(wire):
    python = {lay.c_name: lay for lay in W.LAYOUTS}
    assert set(python) == set(wire.structs), "structs of wire.h vs _wire.LAYOUTS"
    for name, structure in wire.structs.items():
        ours = python[name]
        offsets = ours.offsets()
        assert [f for f, _ in ours.fields] == [f for f, _ in structure._fields_], name
        assert [(f, *offsets[f]) for f, _ in ours.fields] == layout(structure), name
        assert ours.size == ctypes.sizeof(structure), name


def test_message_pack_fills_the_header():
    data = W.DONE.pack(3, W.ERR_MISMATCH, 7, 0, 0, b"why")
    assert W.HEADER.struct.unpack_from(data) == (W.INTAKE_MAGIC, W.INTAKE_VERSION, W.MSG_DONE,
                                                 W.DONE.size, 0)
    assert W.DONE.unpack(data)[:3] == (3, W.ERR_MISMATCH, 7)


@pytest.mark.parametrize("c_name,ours", [("sparsync_world", _client._World),
                                         ("sparsync_tensor_spec", _client._TensorSpec),
                                         ("sparsync_connect_options", _client._ConnectOptions)])
def test_client_binding_structs_match_client_h(wire, c_name, ours):
    client = Header(CLIENT_H, included=wire)
    assert c_name in client.structs
    assert layout(ours) == layout(client.structs[c_name])
    assert ctypes.sizeof(ours) == ctypes.sizeof(client.structs[c_name])
