"""The campaign driver: hands seeds to worker processes, catches crashes and hangs, reduces failing
kernels to small reproducers, and reports.

Every case runs in a worker process (``worker.py`` for the Python front end, the ``nikki_fuzz``
program for the C++ one). A worker that dies (a segfault, an abort) or does not answer within the
timeout is a failure of the case it was running; the harness reports the seed and the kernel's
source, starts a new worker and goes on with the next seed.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FUZZ_DIR = Path(__file__).resolve().parents[1]
DEFAULT_TIMEOUT = 120.0  # CPU seconds per case: a cold start compiles LLVM code for several configurations
# A case also times out after this many times its CPU budget in wall time: a deadlock uses no CPU.
WALL_FACTOR = 20


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) a process has used so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class CaseClock:
    """The time limit of one case: `budget` seconds of the process's CPU time, so that a campaign at
    low priority on a busy machine does not mistake waiting for the CPU for a hang, and
    WALL_FACTOR times that in wall time, for hangs that wait instead of spinning."""

    def __init__(self, pid: int, budget: float):
        self.pid = pid
        self.budget = budget
        self.cpu0 = cpu_seconds(pid)
        self.wall0 = time.monotonic()

    def expired(self) -> bool:
        return (cpu_seconds(self.pid) - self.cpu0 > self.budget or
                time.monotonic() - self.wall0 > WALL_FACTOR * self.budget)

    def describe(self) -> str:
        return (f"no answer within {self.budget:.0f} CPU seconds (or {WALL_FACTOR * self.budget:.0f} s): "
                f"{cpu_seconds(self.pid) - self.cpu0:.0f} CPU s in {time.monotonic() - self.wall0:.0f} s")


@dataclass
class Failure:
    seed: int
    front: str
    kind: str
    detail: str
    source: str
    reduced: str = ""
    path: str = ""

    def report(self) -> str:
        lang = "python" if self.front == "python" else "cpp"
        src = self.reduced or self.source
        head = f"FAIL seed={self.seed} front={self.front} kind={self.kind}"
        note = " (reduced)" if self.reduced else ""
        return (f"{head}\n{self.detail.rstrip()}\n--- reproducer{note}"
                f"{' written to ' + self.path if self.path else ''} ---\n```{lang}\n{src.rstrip()}\n```")


@dataclass
class Report:
    front: str
    cases: int = 0
    passed: int = 0
    valid: int = 0
    invalid: int = 0
    failures: list = field(default_factory=list)
    features: dict = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    finished: float = 0.0
    progress_every: int = 0  # log a summary line every this many cases (0: never)

    @property
    def seconds(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def count(self, valid: bool, passed: bool, log) -> None:
        self.cases += 1
        self.valid += valid
        self.invalid += not valid
        self.passed += passed
        if self.progress_every and self.cases % self.progress_every == 0:
            log(self.summary())

    def summary(self) -> str:
        per = self.seconds / self.cases if self.cases else 0.0
        return (f"nikki fuzz [{self.front}]: {self.cases} cases ({self.valid} valid, {self.invalid} invalid), "
                f"{self.passed} passed, {len(self.failures)} failed, {self.seconds:.1f} s ({per * 1000:.0f} ms per "
                f"case), {len(self.features)} distinct features")


def default_jobs() -> int:
    """Parallel workers: NIKKI_FUZZ_JOBS, else the usable cores up to 2."""
    return int(os.environ.get("NIKKI_FUZZ_JOBS", min(2, len(os.sched_getaffinity(0)))))


def worker_env(jobs: int) -> dict:
    env = dict(os.environ)
    paths = [str(ROOT / "bindings" / "python"), str(FUZZ_DIR)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if jobs > 1:  # the workers already keep the cores busy
        env.setdefault("NIKKI_COMPILE_THREADS", "1")
    return env


class Worker:
    """One Python worker process and its line protocol."""

    def __init__(self, workdir: str, jobs: int = 1):
        self.workdir = workdir
        os.makedirs(workdir, exist_ok=True)
        self.errlog_path = os.path.join(workdir, "stderr.log")
        self.errlog = open(self.errlog_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "kernelfuzz.worker", workdir], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.errlog, env=worker_env(jobs), text=True,
                                     bufsize=1)
        self.buffer = ""

    def send(self, obj: dict) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def clock(self, budget: float) -> CaseClock:
        return CaseClock(self.proc.pid, budget)

    def receive(self, clock: CaseClock, wait: float = 1.0) -> dict | str:
        """The next reply; "timeout" when the case's clock has run out, "idle" when nothing came
        within `wait` seconds, "died" when the process ended."""
        fd = self.proc.stdout.fileno()
        while "\n" not in self.buffer:
            if clock.expired():
                return "timeout"
            sel = selectors.DefaultSelector()
            sel.register(fd, selectors.EVENT_READ)
            ready = sel.select(min(wait, 1.0))
            sel.close()
            if not ready and wait < 1.0:
                return "idle"
            if not ready:
                if self.proc.poll() is not None:
                    return "died"
                continue
            chunk = os.read(fd, 1 << 16).decode()
            if not chunk:
                return "died"
            self.buffer += chunk
        line, self.buffer = self.buffer.split("\n", 1)
        return json.loads(line)

    def stderr_tail(self, lines: int = 30) -> str:
        self.errlog.flush()
        try:
            with open(self.errlog_path) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def death(self) -> str:
        """How the process ended, once its output has closed."""
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return "closed its output but did not exit"
        if code < 0:
            import signal

            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with status {code}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.errlog.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"op": "exit"})
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


class PythonCampaign:
    """Seeds -> Python workers (one case at a time each)."""

    def __init__(self, jobs: int, timeout: float, out_dir: Path | None, reduce: bool, log=print,
                 progress_every: int = 0):
        self.jobs = max(1, jobs)
        self.timeout = timeout
        self.out_dir = out_dir
        self.reduce = reduce
        self.log = log
        self.progress_every = progress_every
        self.tmp = tempfile.mkdtemp(prefix="nikki-fuzz-")
        self.spawned = 0

    def new_worker(self) -> Worker:
        self.spawned += 1
        return Worker(os.path.join(self.tmp, f"w{self.spawned}"), self.jobs)

    def run(self, seeds) -> Report:
        report = Report("python", progress_every=self.progress_every)
        pending = list(seeds)[::-1]
        workers = [self.new_worker() for _ in range(min(self.jobs, len(pending)))]
        state = {}  # worker -> [seed, source, expect, clock]
        try:
            while pending or state:
                for w in workers:
                    if w not in state and pending:
                        seed = pending.pop()
                        w.send({"op": "case", "seed": seed})
                        state[w] = [seed, "", None, w.clock(self.timeout)]
                for i, w in enumerate(workers):
                    if w not in state:
                        continue
                    seed, source, expect, clock = state[w]
                    msg = w.receive(clock, wait=0.05)
                    if msg == "idle":
                        continue
                    if isinstance(msg, str):  # died or hung: the case failed, the worker is replaced
                        kind = "crash" if msg == "died" else "timeout"
                        why = w.death() if msg == "died" else clock.describe()
                        detail = f"the worker {why} while running the case\n{w.stderr_tail()}"
                        w.kill()
                        workers[i] = self.new_worker()
                        del state[w]
                        self.record(report, seed, kind, detail, source, expect, signature="")
                        report.count(expect is None, False, self.log)
                        continue
                    if msg["event"] == "source":
                        state[w][1], state[w][2] = msg["source"], msg["expect"]
                        continue
                    del state[w]
                    for feat in msg.get("features", []):
                        report.features[feat] = report.features.get(feat, 0) + 1
                    if not msg["ok"]:
                        self.record(report, seed, msg["kind"], msg["detail"], source, expect,
                                    signature=msg.get("signature", ""))
                    report.count(expect is None, msg["ok"], self.log)
        finally:
            for w in workers:
                w.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
        report.finished = time.monotonic()
        return report

    def record(self, report: Report, seed: int, kind: str, detail: str, source: str, expect,
               signature: str) -> None:
        if not source:  # the worker died or hung before it sent the kernel: generate it again
            from .worker import generate

            source = generate(seed).source
        failure = Failure(seed, "python", kind, detail, source)
        if self.reduce and source and kind not in ("reference", "generator"):
            failure.reduced = self.reduce_source(source, expect, kind, signature, seed)
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            path = self.out_dir / f"python_seed{seed}_{kind}.py"
            path.write_text(failure.reduced or source)
            failure.path = str(path)
        report.failures.append(failure)
        self.log(failure.report())

    # --- reduction ---------------------------------------------------------------------------
    def reduce_source(self, source: str, expect, kind: str, signature: str, seed: int,
                      budget_s: float = 120.0) -> str:
        """Removes kernel lines one at a time while the variant still fails the same way (the same
        failure kind and, for exceptions, the same `signature`: type and message). Statements
        that open a block are removed with their block."""
        lines = source.split("\n")
        start = next(i for i, l in enumerate(lines) if l.startswith("def kernel(")) + 1
        end = next(i for i in range(start, len(lines)) if lines[i].startswith("    return "))
        worker = self.new_worker()
        deadline = time.monotonic() + budget_s

        def still_fails(candidate: list[str]) -> bool:
            nonlocal worker
            text = "\n".join(candidate)
            worker.send({"op": "source", "seed": seed, "source": text, "expect": expect})
            msg = worker.receive(worker.clock(self.timeout))
            if isinstance(msg, str):
                worker.kill()
                worker = self.new_worker()
                return kind == ("crash" if msg == "died" else "timeout")
            if msg["ok"]:
                return False
            return msg["kind"] == kind and msg.get("signature", "") == signature

        try:
            i = end - 1
            while i >= start and time.monotonic() < deadline:
                block_end = i + 1
                indent = len(lines[i]) - len(lines[i].lstrip())
                while block_end < end and (len(lines[block_end]) - len(lines[block_end].lstrip())) > indent:
                    block_end += 1
                candidate = lines[:i] + lines[block_end:]
                if still_fails(candidate):
                    removed = block_end - i
                    lines = candidate
                    end -= removed
                i -= 1
        finally:
            worker.close()
        reduced = "\n".join(lines)
        return reduced if reduced != source else ""


# --- the C++ front end -----------------------------------------------------------------------

def cpp_driver() -> Path | None:
    """The nikki_fuzz program of the build (NIKKI_FUZZ_DRIVER, else under $BUILD or build/)."""
    explicit = os.environ.get("NIKKI_FUZZ_DRIVER")
    if explicit:
        return Path(explicit)
    build = os.environ.get("BUILD", "build")
    for candidate in (ROOT / build / "tests" / "fuzz" / "cpp" / "nikki_fuzz", Path(build) / "tests" / "fuzz" / "cpp" /
                      "nikki_fuzz"):
        if candidate.exists():
            return candidate
    return None


class CppCampaign:
    """Runs a range of seeds through `jobs` nikki_fuzz processes, in batches of consecutive seeds;
    a crash or hang ends a batch, is reported with the seed and the C++ reproducer, and the batch
    goes on after it."""

    def __init__(self, driver: Path, timeout: float, out_dir: Path | None, log=print, batch: int = 100,
                 progress_every: int = 0, jobs: int = 1):
        self.driver = driver
        self.timeout = timeout
        self.out_dir = out_dir
        self.log = log
        self.batch = batch
        self.progress_every = progress_every
        self.jobs = max(1, jobs)
        self.lock = threading.Lock()  # guards the report: batches run on threads

    def run(self, seeds: range) -> Report:
        report = Report("cpp", progress_every=self.progress_every)
        batches = [(start, min(self.batch, seeds.stop - start)) for start in range(seeds.start, seeds.stop, self.batch)]

        def run_batches(mine):
            for first, count in mine:
                while count > 0:  # after a crash, the rest of the batch
                    done, crashed = self.run_batch(report, first, count)
                    finished = done + (crashed is not None)
                    first, count = first + finished, count - finished

        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            for future in [pool.submit(run_batches, batches[j::self.jobs]) for j in range(self.jobs)]:
                future.result()
        report.finished = time.monotonic()
        return report

    def run_batch(self, report: Report, first: int, count: int):
        """Runs seeds first..first+count-1; returns (cases finished, seed that crashed or None)."""
        cmd = [str(self.driver), "--seed", str(first), "--cases", str(count)]
        env = dict(os.environ)
        if self.jobs > 1:  # the driver processes already keep the cores busy
            env.setdefault("NIKKI_COMPILE_THREADS", "1")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env)
        current, current_valid, done, buffer = None, True, 0, []
        clock = CaseClock(proc.pid, self.timeout)
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        hung = ""
        while True:
            if not sel.select(timeout=1.0):
                if clock.expired():
                    hung = clock.describe()
                    proc.kill()
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            buffer.append(line)
            m = re.match(r"^case (\d+) (begin|ok|FAIL)(?: (\S+))?", line)
            if not m:
                continue
            seed, what = int(m.group(1)), m.group(2)
            if what == "begin":
                current, current_valid, buffer = seed, m.group(3) != "invalid", [line]
                clock = CaseClock(proc.pid, self.timeout)
                continue
            done += 1
            if what == "FAIL":
                self.record(report, seed, m.group(3) or "mismatch", "".join(buffer))
            with self.lock:
                for feat in re.findall(r"\bfeature=(\S+)", line):
                    report.features[feat] = report.features.get(feat, 0) + 1
                report.count(current_valid, what == "ok", self.log)
            current = None
        sel.close()
        code = proc.wait()
        if current is None:
            return done, None
        kind = "timeout" if hung else "crash"
        why = hung or f"the driver died (status {code})"
        self.record(report, current, kind, why + "\n" + "".join(buffer[-40:]))
        with self.lock:
            report.count(current_valid, False, self.log)
        return done, current

    def reproducer(self, seed: int) -> str:
        try:
            out = subprocess.run([str(self.driver), "--seed", str(seed), "--print"], capture_output=True, text=True,
                                 timeout=60)
            return out.stdout
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"(could not print the reproducer: {err})"

    def record(self, report: Report, seed: int, kind: str, detail: str) -> None:
        failure = Failure(seed, "cpp", kind, detail, self.reproducer(seed))
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            path = self.out_dir / f"cpp_seed{seed}_{kind}.cpp"
            path.write_text(failure.source)
            failure.path = str(path)
        with self.lock:
            report.failures.append(failure)
            self.log(failure.report())
