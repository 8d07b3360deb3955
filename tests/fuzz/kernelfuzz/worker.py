"""A worker process: generates and judges cases on request, one JSON object per line.

Requests arrive on stdin; replies go to the worker's original stdout, while file descriptor 1
itself is redirected to /dev/null so that kernels that print (``nl.device_print``) cannot corrupt
the protocol. Before running a case the worker sends its source, so that a crash or a hang still
leaves the parent a reproducer.

    {"op": "case", "seed": 7}                                   -> {"event": "source", ...}, {"event": "result", ...}
    {"op": "source", "seed": 7, "source": "...", "expect": {...} | null} -> {"event": "result", ...}
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import traceback

from . import faults, gen_python, oracle
from .case import ExpectedError

# Programs and native objects of every case land in the disk cache (the second configuration of a
# case loads the first one's device program from it); it is emptied now and then.
CACHE_WIPE_EVERY = 200


def generate(seed: int):
    """The case of `seed`: a valid kernel, or an invalid one for one seed in four."""
    case = faults.generate_invalid(seed) if seed % 4 == 3 else gen_python.generate_valid(seed)
    return sabotaged(case) if os.environ.get(SABOTAGE_ENV, "").endswith(f":{seed}") else case


# The harness's own tests: NIKKI_FUZZ_SABOTAGE=crash:<seed> (or hang:<seed>) makes that seed's
# kernel kill its process (or never return), as a nikki bug could.
SABOTAGE_ENV = "NIKKI_FUZZ_SABOTAGE"
_SABOTAGE = {"crash": "__import__('os').kill(__import__('os').getpid(), 11)", "hang": "while True: pass"}


def sabotaged(case):
    how = os.environ[SABOTAGE_ENV].split(":")[0]
    marker = "def kernel("
    head, _, rest = case.source.partition(marker)
    signature, _, body = rest.partition("\n")
    case.source = f"{head}{marker}{signature}\n    {_SABOTAGE[how]}\n{body}"
    return case


def expectation(case) -> dict | None:
    if case.error is None:
        return None
    return {"pattern": case.error.pattern, "lines": list(case.error.lines), "what": case.error.what}


def main() -> None:
    workdir = sys.argv[1]
    os.makedirs(workdir, exist_ok=True)
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    cache = os.path.join(workdir, "cache")
    os.environ["NIKKI_CACHE_DIR"] = cache
    done = 0

    def send(obj) -> None:
        reply.write(json.dumps(obj) + "\n")
        reply.flush()

    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "exit":
            break
        seed = int(req.get("seed", 0))
        path = os.path.join(workdir, f"case_{seed}.py")
        try:
            if req["op"] == "case":
                case = generate(seed)
                send({"event": "source", "seed": seed, "source": case.source, "expect": expectation(case),
                      "path": path})
                outcome = oracle.judge(case, path, seed)
                features = case.features
            else:
                e = req.get("expect")
                expected = ExpectedError(e["pattern"], tuple(e["lines"]), e.get("what", "")) if e else None
                outcome = oracle.run_source(req["source"], path, expected, seed)
                features = []
        except Exception:
            send({"event": "result", "seed": seed, "ok": False, "kind": "generator",
                  "detail": "the fuzzer itself failed:\n" + traceback.format_exc(), "signature": "",
                  "configs": 0, "features": []})
            continue
        send({"event": "result", "seed": seed, **outcome.as_dict(), "features": features})
        if outcome.ok and os.path.exists(path):
            os.remove(path)
        done += 1
        if done % CACHE_WIPE_EVERY == 0:
            shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
