"""nikki's kernel fuzzer as a test: random kernels, valid and invalid, through both front ends.

Each front end runs NIKKI_FUZZ_CASES cases starting at seed NIKKI_FUZZ_SEED (a bounded run by
default; `make fuzz` runs 10^5). Valid kernels must give byte-identical outputs on the reference
interpreter and the native executor under every stream order, and match the numpy reference where
the case has one; invalid kernels must raise a located nikki.KernelError naming the broken rule.
A failure prints its seed and a (reduced) reproducer; `python3 -m kernelfuzz --show SEED` prints
a case again (see tests/fuzz/README.md).
"""

import os
from pathlib import Path

import pytest

from kernelfuzz import harness

# The bounded run of `make test`: about a minute for both front ends on two otherwise idle cores.
DEFAULT_PYTHON_CASES = 100
DEFAULT_CPP_CASES = 200


def _cases(default: int) -> int:
    return int(os.environ.get("NIKKI_FUZZ_CASES", default))


def _seed() -> int:
    return int(os.environ.get("NIKKI_FUZZ_SEED", "0"))


def _progress(cases: int) -> int:
    return 1000 if cases >= 5000 else 0  # `make fuzz` shows how far it got


def _out_dir() -> Path:
    return harness.ROOT / os.environ.get("BUILD", "build") / "fuzz-failures"


def _check(report) -> None:
    print(report.summary())
    assert not report.failures, f"{report.summary()}\n\n" + "\n\n".join(f.report() for f in report.failures)
    assert report.passed == report.cases


def test_python_front_end_kernels():
    cases, seed = _cases(DEFAULT_PYTHON_CASES), _seed()
    campaign = harness.PythonCampaign(jobs=harness.default_jobs(), timeout=harness.DEFAULT_TIMEOUT,
                                      out_dir=_out_dir(), reduce=True, progress_every=_progress(cases))
    _check(campaign.run(range(seed, seed + cases)))


def test_cpp_front_end_kernels():
    driver = harness.cpp_driver()
    if driver is None:
        pytest.fail("the nikki_fuzz program is not built: run `make build` (or set NIKKI_FUZZ_DRIVER)")
    cases, seed = _cases(DEFAULT_CPP_CASES), _seed()
    campaign = harness.CppCampaign(driver, timeout=harness.DEFAULT_TIMEOUT, out_dir=_out_dir(),
                                   progress_every=_progress(cases), jobs=harness.default_jobs())
    _check(campaign.run(range(seed, seed + cases)))


def _campaign(front: str, timeout: float, jobs: int = 1):
    if front == "python":
        return harness.PythonCampaign(jobs=jobs, timeout=timeout, out_dir=None, reduce=False)
    driver = harness.cpp_driver()
    if driver is None:
        pytest.fail("the nikki_fuzz program is not built: run `make build` (or set NIKKI_FUZZ_DRIVER)")
    return harness.CppCampaign(driver, timeout=timeout, out_dir=None, jobs=jobs)


@pytest.mark.parametrize("front", ["python", "cpp"])
def test_a_crash_is_reported_with_its_seed_and_kernel_and_the_campaign_goes_on(front, monkeypatch):
    monkeypatch.setenv("NIKKI_FUZZ_SABOTAGE", "crash:41")  # seed 41's kernel kills its process
    report = _campaign(front, harness.DEFAULT_TIMEOUT).run(range(40, 43))
    assert (report.cases, report.passed) == (3, 2)
    [failure] = report.failures
    assert (failure.seed, failure.kind) == (41, "crash")
    assert "SIGSEGV" in failure.detail or "status -11" in failure.detail
    assert ("def kernel(" if front == "python" else "nikki::trace_specs") in failure.source


@pytest.mark.parametrize("front", ["python", "cpp"])
def test_a_hang_is_reported_with_its_seed_and_kernel(front, monkeypatch):
    monkeypatch.setenv("NIKKI_FUZZ_SABOTAGE", "hang:40")
    report = _campaign(front, timeout=5).run(range(40, 41))
    [failure] = report.failures
    assert (failure.seed, failure.kind, report.cases) == (40, "timeout", 1)
    assert ("def kernel(" if front == "python" else "nikki::trace_specs") in failure.source
