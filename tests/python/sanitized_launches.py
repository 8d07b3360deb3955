"""A pytest plugin for test_sanitizer.py's runs of other test files under NIKKI_SANITIZE=1: it
checks that every kernel launch ran on the sanitizer and reports how many did."""

import nikki.kernel

_launches = 0


def _observe(kernel, compiled):
    global _launches
    executors = {p.executor for p in compiled.programs}
    assert executors == {"sanitizer"}, f"{kernel!r} ran on {executors}, not on the sanitizer"
    _launches += 1


def pytest_configure(config):
    nikki.kernel.launch_observers.append(_observe)


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"sanitized launches: {_launches}")
