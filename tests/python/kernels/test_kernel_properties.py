"""Property-based checks of every library kernel, driven by its registration.

For each kernel of the registry: its examples and randomly drawn cases (shapes with tails and
odd sizes, grouped-query ratios, causal or not, head dims, dtypes, eps, ...; drawn by the
registration's seeded generator) run through ``nikki.kernels.<name>`` and are compared with two
independent references: the kernel's float64 reference (C++, beside the kernel) and PyTorch's own
implementation of the same operation, computed in float64 (for a backward kernel, PyTorch's
backward of the forward operation).

Cases per kernel: NIKKI_SWEEP_CASES (4 by default, so `make test` stays quick; `make sweep` runs
many more), seeds from NIKKI_SWEEP_SEED (1 by default). A failure prints the seed and the case.

Tolerance (from the registration): |got - ref| <= atol * max(1, max |ref|) + rtol * |ref|. The
kernels compute in fp32 and round each output once, so an fp32 result is within a few fp32 ulps
times the depth of its reductions (1e-5); a 16-bit result carries its store's rounding plus the
error of 16-bit intermediates feeding fp32 maths (2e-2 for bf16, 5e-3 for fp16).
"""

import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nikki import _core  # noqa: E402
from nikki.dtypes import numpy_dtype, to_dtype  # noqa: E402
from nikki.library import library_kernels  # noqa: E402
from nikki.torch_equivalents import NO_TORCH_EQUIVALENT, TORCH  # noqa: E402

CASES = int(os.environ.get("NIKKI_SWEEP_CASES", "4"))
FIRST_SEED = int(os.environ.get("NIKKI_SWEEP_SEED", "1"))


# --- the sweep ----------------------------------------------------------------------------------

def _cases():
    for name, kernel in sorted(library_kernels().items()):
        for index in range(len(kernel.info["examples"])):
            yield pytest.param(name, "example", index, id=f"{name}-example{index}")
        for seed in range(FIRST_SEED, FIRST_SEED + CASES):
            yield pytest.param(name, "drawn", seed, id=f"{name}-seed{seed}")


def _call_params(kernel, params):
    kinds = {p[0]: p[1] for p in kernel.info["params"]}
    return {k: (bool(v) if kinds[k] == "bool" else None if kinds[k] == "float?" and math.isnan(v) else v)
            for k, v in params.items()}


def _assert_close(got, ref, tol, what):
    rtol, atol = tol
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    peak = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
    err = np.abs(got - ref)
    bad = ~(err <= atol * peak + rtol * np.abs(ref))
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} elements off, worst {float(np.nanmax(err))} "
                           f"(max |ref| {peak}, rtol {rtol}, atol {atol})")


def test_every_kernel_has_a_pytorch_counterpart_or_a_reason():
    names = set(library_kernels())
    missing = sorted(names - set(TORCH) - set(NO_TORCH_EQUIVALENT))
    assert not missing, f"kernels with no PyTorch comparison in this sweep (add one, or a reason): {missing}"


@pytest.mark.parametrize("name,kind,index", list(_cases()))
def test_kernel_matches_its_reference_and_pytorch(name, kind, index):
    kernel = library_kernels()[name]
    case = _core.library_case(name, kind, index)
    what = f"{name} {kind} {index} ({case['label']}; inputs {[tuple(s) for s, _ in case['inputs']]}, " \
           f"dtypes {[to_dtype(d).name for _, d in case['inputs']]}, params {case['params']})"
    arrays = [v.astype(numpy_dtype(to_dtype(d))) for v, (_, d) in zip(case["values"], case["inputs"])]
    params = _call_params(kernel, case["params"])
    defaults = {p[0]: p[2] for p in kernel.info["params"]}
    got = kernel(*arrays, **params)
    got = got if isinstance(got, tuple) else (got,)
    # Inputs the kernel updates in place are checked after its outputs (the reference's order).
    got += tuple(arrays[kernel.inputs.index(n)] for n in kernel.updated_inputs)
    names = kernel.outputs + kernel.updated_inputs
    reference = _core.library_reference(name, case["values"], case["params"])
    pytorch = (TORCH[name](*[torch.from_numpy(v) for v in case["values"]], {**defaults, **params})
               if name in TORCH else None)
    assert len(got) == len(reference) == len(names)
    for i, out_name in enumerate(names):
        _assert_close(got[i].astype(np.float64), reference[i], case["tolerance"], f"{what} output '{out_name}' "
                      "against the float64 reference")
        if pytorch is not None:
            _assert_close(got[i].astype(np.float64), pytorch[i].detach().numpy(), case["tolerance"],
                          f"{what} output '{out_name}' against PyTorch")
