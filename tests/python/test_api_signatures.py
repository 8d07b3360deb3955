"""Every public function of nki.isa and nki.language shows NKI's signature (inspect.signature,
help(), IDEs and type checkers read it), with annotations and a docstring; a call with a keyword
the function does not take is a TypeError that names the public function, not a private helper."""

import inspect
import pathlib

import numpy as np
import pytest

import nikki as nki
import nikki.isa as nisa
import nikki.language as nl

# Functions whose NKI signature is variadic: nl.arange(*args) (Beta 1's numpy-like arange) and
# nl.spmd_dim(*sizes).
VARIADIC = {"nl.arange", "nl.spmd_dim"}


def public_functions():
    found = []
    for prefix, module in (("nisa", nisa), ("nl", nl)):
        for name in sorted(vars(module)):
            fn = getattr(module, name)
            if name.startswith("_") or not inspect.isfunction(fn):
                continue
            if fn.__module__ != module.__name__ and fn is not nl.ndarray:  # helpers it imports
                continue
            found.append((f"{prefix}.{name}", fn))
    return found


def test_the_package_has_the_public_functions_it_should():
    names = {name for name, _ in public_functions()}
    assert len(names) >= 165
    assert {"nisa.tensor_tensor", "nisa.nc_matmul", "nisa.topk", "nl.ndarray", "nl.add", "nl.exp"} <= names


@pytest.mark.parametrize("qualified, fn", public_functions(), ids=lambda v: v if isinstance(v, str) else "")
def test_public_function_has_an_annotated_signature_and_a_docstring(qualified, fn):
    sig = inspect.signature(fn)
    variadic = [p.name for p in sig.parameters.values() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    assert not variadic or qualified in VARIADIC, f"{qualified}{sig} hides its parameters"
    unannotated = [p.name for p in sig.parameters.values() if p.annotation is p.empty]
    assert not unannotated, f"{qualified}: parameters without annotation: {unannotated}"
    assert sig.return_annotation is not sig.empty, f"{qualified} has no return annotation"
    assert len((fn.__doc__ or "").strip()) >= 20, f"{qualified} has no docstring"


# NKI 0.6's parameter names of instructions nikki implements in both forms (the current form is
# what the signature shows; the legacy form stays callable).
CURRENT_FORMS = {
    "tensor_copy": ["dst", "src", "engine", "name"],
    "tensor_tensor": ["dst", "data1", "data2", "op", "engine", "name"],
    "tensor_scalar": ["dst", "data", "op0", "operand0", "reverse0", "op1", "operand1", "reverse1", "engine", "name"],
    "activation": ["dst", "op", "data", "bias", "scale", "reduce_op", "reduce_res", "reduce_cmd", "name"],
    "nc_matmul": ["dst", "stationary", "moving", "is_stationary_onezero", "is_moving_onezero", "is_transpose",
                  "accumulate", "tile_position", "tile_size", "perf_mode", "name"],
    "iota": ["dst", "pattern", "offset", "channel_multiplier", "name"],
    "affine_select": ["dst", "pattern", "channel_multiplier", "on_true_tile", "on_false_value", "cmp_op", "offset",
                      "name"],
    "tensor_scalar_reduce": ["dst", "data", "op0", "operand0", "reduce_op", "reduce_res", "reverse0", "reduce_cmd",
                             "reduce_init", "reduce_res_negate", "name"],
    "dma_transpose": ["dst", "src", "axes", "priority", "dge_mode", "oob_mode", "name"],
    "nc_stream_shuffle": ["dst", "src", "shuffle_mask", "name", "mask", "dtype"],
    "topk": ["val_dst", "idx_dst", "src", "n", "name"],
}


@pytest.mark.parametrize("name", sorted(CURRENT_FORMS))
def test_instruction_signature_is_nkis_current_form(name):
    params = list(inspect.signature(getattr(nisa, name)).parameters)
    assert params == CURRENT_FORMS[name]


def test_defaults_are_nkis():
    sig = inspect.signature(nisa.activation)
    assert sig.parameters["scale"].default == 1.0
    assert sig.parameters["reduce_cmd"].default is nisa.reduce_cmd.idle
    assert inspect.signature(nisa.nc_matmul).parameters["perf_mode"].default is nisa.matmul_perf_mode.none
    assert inspect.signature(nl.softmax).parameters["axis"].default == -1
    assert inspect.signature(nl.rms_norm).parameters["epsilon"].default == 1e-6


def _traced(body):
    @nki.jit
    def kernel(a):
        t = nl.load(a)
        d = nl.ndarray(t.shape, t.dtype)
        body(t, d)
        return nl.store(nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm), d)

    return kernel


@pytest.mark.parametrize("body, public", [
    (lambda t, d: nisa.tensor_copy(d, t, bogus=1), "nisa.tensor_copy"),  # current form
    (lambda t, d: nisa.tensor_copy(t, bogus=1), "nisa.tensor_copy"),  # legacy form
    (lambda t, d: nisa.tensor_tensor(dst=d, data1=t, data2=t, op=nl.add, bogus=1), "nisa.tensor_tensor"),
    (lambda t, d: nisa.activation(d, nl.exp, t, bogus=1), "nisa.activation"),
    (lambda t, d: nisa.memset(d, 0.0, bogus=1), "nisa.memset"),
    (lambda t, d: nisa.dma_copy(dst=d, src=t, bogus=1), "dma_copy()"),
    (lambda t, d: nisa.nc_stream_shuffle(d, t, [0] * 32, bogus=1), "nc_stream_shuffle()"),
    (lambda t, d: nisa.topk(d, d, t, 8, bogus=1), "topk()"),
    (lambda t, d: nl.add(t, t, bogus=1), "add()"),
    (lambda t, d: nl.exp(t, dtyp=nl.bfloat16), "exp()"),
    (lambda t, d: nl.abs_max(t, t, bogus=1), "abs_max()"),
    (lambda t, d: nl.rand((4, 8), nl.float32, bogus=1), "rand()"),
])
def test_a_wrong_keyword_is_a_type_error_naming_the_public_function(body, public):
    with pytest.raises(TypeError) as info:
        _traced(body)(np.ones((4, 8), np.float32))
    text = str(info.value)
    assert public in text and "unexpected keyword argument" in text
    assert "_legacy" not in text and "._" not in text  # no private helper is named


def test_the_package_is_marked_typed():
    package = pathlib.Path(nki.__file__).parent
    assert (package / "py.typed").is_file()
    assert (package / "_core.pyi").is_file()
