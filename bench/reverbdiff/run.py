#!/usr/bin/env python3
"""Differential harness: runs the scenarios of scenarios.py against DeepMind
Reverb 0.14.0, Reprise's engine in-process and reprised end to end, and
prints one line per scenario:

    same        NAME
    different   NAME  TARGET: what differs; ...
    deliberate  NAME  (listed in docs/reverb-differences.md) TARGET: ...

    python3 bench/reverbdiff/run.py [--only SUBSTRING] [--no-e2e] [--json OUT]

Reverb runs in the venv bench/reverb/setup.sh makes ($REPRISE_REVERB_VENV,
else ~/.cache/reprise-bench/reverb-venv); reprised's client in
$REPRISE_VENV, else .venv of this checkout or of /work/main. Only the
standard library is needed here.

Sampled items are compared one by one for deterministic samplers. For the
random ones (uniform, prioritized) "dist" draws N samples: each system's
counts must fit the probabilities p^a / sum(p^a) (zero priority: zero;
all zero: uniform) within a Chernoff bound on the binomial tails that a
correct sampler exceeds with probability below 1e-6 per scenario, and the
probabilities both systems report for the same item must agree to 1e-9
relative.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import selectors
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.dont_write_bytecode = True  # no __pycache__ in the checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
import scenarios as sc  # noqa: E402

Json = dict[str, Any]
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DOCS = ROOT / "docs" / "reverb-differences.md"
# An item's count fails when the Chernoff bound on the binomial tail beyond
# it, exp(-N KL(count/N || q)), is below ALPHA: a correct sampler does that
# with probability below ALPHA (the bound bounds the tail; no normal
# approximation, which rare items would break). A scenario has one draw
# of at most 10 items per system, 2 systems: below 1e-6 in all.
ALPHA = 5e-8
REL = 1e-9
RUNNER_STALL = 30.0  # seconds without output before a runner counts as hung


def reverb_python() -> Path:
    venv = os.environ.get("REPRISE_REVERB_VENV") or str(Path.home() / ".cache/reprise-bench/reverb-venv")
    py = Path(venv) / "bin" / "python"
    if not py.exists():
        sys.exit(f"run.py: no Reverb venv at {venv}: run bash bench/reverb/setup.sh")
    return py


def reprise_python() -> Path | None:
    for venv in (os.environ.get("REPRISE_VENV"), str(ROOT / ".venv"), "/work/main/.venv"):
        if venv and (Path(venv) / "bin" / "python").exists():
            return Path(venv) / "bin" / "python"
    return None


def run_lines(cmd: list[str], scens: list[Json], env: dict[str, str] | None = None) -> dict[str, list[Json]]:
    """Runs a JSON-lines runner over scens, restarting it after the scenario
    it crashed or stalled in, whose observations end with a "crashed"
    one."""
    results: dict[str, list[Json]] = {}
    todo = list(scens)
    while todo:
        with tempfile.TemporaryFile("w+") as inp:
            json.dump(todo, inp)
            inp.seek(0)
            proc = subprocess.Popen(cmd, stdin=inp, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
            current: str | None = None
            assert proc.stdout is not None
            sel = selectors.DefaultSelector()
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                if not sel.select(RUNNER_STALL):
                    proc.kill()
                    break
                line = proc.stdout.readline()
                if not line:
                    break
                rec = json.loads(line)
                if "start" in rec:
                    current = rec["start"]
                    results[current] = []
                elif "obs" in rec:
                    assert current is not None
                    results[current].append(rec["obs"])
                elif "end" in rec:
                    current = None
            proc.wait()
        done = set(results)
        if current is not None:
            results[current].append({"op": "crashed", "error": "crashed or hung"})
        todo = [s for s in todo if s["name"] not in done]
    return results


def run_engine(scens: list[Json]) -> dict[str, list[Json]]:
    out = subprocess.run(
        ["go", "run", "./bench/reverbdiff/engine"], input=json.dumps(scens), capture_output=True, text=True, cwd=ROOT
    )
    if out.returncode != 0:
        sys.exit(f"run.py: engine runner failed: {out.stderr}")
    results: dict[str, list[Json]] = json.loads(out.stdout)
    return results


# --- comparison -------------------------------------------------------------


def fnum(x: Any) -> float:
    return float(x)


def close(a: Any, b: Any) -> bool:
    """Numbers equal to REL, with +-DBL_MAX standing for +-inf (Reverb's
    presets spell an unbounded limiter with DBL_MAX, Reprise with inf)."""
    x, y = fnum(a), fnum(b)
    x = math.copysign(math.inf, x) if abs(x) >= sc.DBL_MAX else x
    y = math.copysign(math.inf, y) if abs(y) >= sc.DBL_MAX else y
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    if math.isinf(x) or math.isinf(y):
        return x == y
    return abs(x - y) <= REL * max(abs(x), abs(y))


def diff_value(path: str, a: Any, b: Any, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k == "message":
                continue
            diff_value(f"{path}.{k}", a.get(k), b.get(k), out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} vs {len(b)} entries ({short(a)} vs {short(b)})")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            diff_value(f"{path}[{i}]", x, y, out)
    elif isinstance(a, (int, float, str)) and isinstance(b, (int, float, str)) and not isinstance(a, bool):
        try:
            same = close(a, b)
        except ValueError:
            same = a == b
        if not same:
            out.append(f"{path}: {a} vs {b}")
    elif a != b:
        out.append(f"{path}: {a} vs {b}")


def short(v: Any) -> str:
    s = json.dumps(v)
    return s if len(s) <= 120 else s[:117] + "..."


def expected(prios: list[tuple[str, float]], exponent: float) -> dict[str, float]:
    """p^a / sum(p^a) in log space, so that no power or sum overflows;
    a zero priority weighs 0 for every exponent; all zero is uniform."""
    logs = {i: exponent * math.log(p) for i, p in prios if p > 0}
    if not logs:
        return {i: 1 / len(prios) for i, _ in prios}
    top = max(logs.values())
    w = {i: math.exp(lw - top) for i, lw in logs.items()}
    total = sum(w.values())
    return {i: w.get(i, 0.0) / total for i, _ in prios}


def kl(a: float, q: float) -> float:
    """The Kullback-Leibler divergence of Bernoulli(a) from Bernoulli(q)."""

    def term(x: float, y: float) -> float:
        if x == 0:
            return 0.0
        return math.inf if y == 0 else x * math.log(x / y)

    return term(a, q) + term(1 - a, 1 - q)


def judge_dist(obs: Json, contents: Json | None, exponent: float, kind: str) -> str:
    """"fits" or what does not fit the expected distribution."""
    if obs.get("error") or contents is None:
        return f"error {obs.get('error')}"
    prios = [(str(it["id"]), fnum(it["priority"])) for it in contents["items"]]
    q = expected(prios, exponent) if kind == "prioritized" else {i: 1 / len(prios) for i, _ in prios}
    n = obs["n"]
    bad = []
    for i in sorted(set(q) | set(obs["counts"])):
        c, qi = obs["counts"].get(i, 0), q.get(i, 0.0)
        if math.exp(-n * kl(c / n, qi)) < ALPHA:
            bad.append(f"id {i}: {c}/{n} sampled, expected p={qi:.6g}")
    for i, p in obs["probabilities"].items():
        if not close(p, q.get(i, 0.0)) and abs(fnum(p) - q.get(i, 0.0)) > 1e-12:
            bad.append(f"id {i}: reports p={p}, expected {q.get(i, 0.0):.6g}")
    return "fits" if not bad else "; ".join(bad)


def compare(s: Json, ref: list[Json], got: list[Json]) -> list[str]:
    """What differs between Reverb's observations (ref) and a target's."""
    out: list[str] = []
    if ref[0].get("error") != got[0].get("error"):
        return [f"create: {ref[0].get('error') or 'ok'} vs {got[0].get('error') or 'ok'} ({got[0].get('message', ref[0].get('message', ''))})"]
    ops = [{"op": "create"}] + s["ops"]
    sampler = s["table"]["sampler"]
    exponent = fnum(sampler.get("exponent", 1.0))
    last_contents: dict[str, Json | None] = {"ref": None, "got": None}
    for k, (op, a, b) in enumerate(zip(ops, ref, got)):
        where = f"op {k} ({op['op']}{' ' + str(op['id']) if 'id' in op else ''})"
        if a.get("op") == "crashed" or b.get("op") == "crashed":
            out.append(f"{where}: {a.get('error') or 'ok'} vs {b.get('error') or 'ok'}")
            break
        if op["op"] == "contents":
            last_contents = {"ref": a, "got": b}
        if op["op"] == "dist":
            ja = judge_dist(a, last_contents["ref"], exponent, sampler["kind"])
            jb = judge_dist(b, last_contents["got"], exponent, sampler["kind"])
            if ja != jb:
                out.append(f"{where}: Reverb {ja}; Reprise {jb}")
            both = set(a.get("probabilities", {})) & set(b.get("probabilities", {}))
            for i in sorted(both):
                if not close(a["probabilities"][i], b["probabilities"][i]):
                    out.append(f"{where}: id {i} probability {a['probabilities'][i]} vs {b['probabilities'][i]}")
            continue
        a, b = dict(a), dict(b)
        if s["random"] and op["op"] == "sample":
            a["items"] = len(a.get("items", []))
            b["items"] = len(b.get("items", []))
        if s["random_remover"] and op["op"] == "contents":
            a["items"] = len(a.get("items", []))
            b["items"] = len(b.get("items", []))
        elif s["random"] and op["op"] == "contents":
            for x in (a, b):
                x["items"] = [{k2: v for k2, v in it.items() if k2 != "times_sampled"} for it in x.get("items", [])]
        d: list[str] = []
        diff_value("", a, b, d)
        out += [f"{where}{x}" for x in d]
    if len(ref) != len(got) and not out:
        out.append(f"{len(ref)} vs {len(got)} observations")
    return out


def deliberate_names() -> set[str]:
    """Scenario names in the Scenarios column (the last) of the docs'
    table."""
    if not DOCS.exists():
        return set()
    cells = [line.rstrip(" |").rsplit("|", 1)[-1] for line in DOCS.read_text().splitlines() if line.startswith("|")]
    return set(re.findall(r"`([a-z0-9_-]+)`", "\n".join(cells)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="run the scenarios whose name contains this")
    ap.add_argument("--no-e2e", action="store_true", help="skip reprised (the engine and Reverb only)")
    ap.add_argument("--json", help="write every observation to this file")
    args = ap.parse_args()
    scens = [s for s in sc.all_scenarios() if args.only in s["name"]]

    reverb = run_lines([str(reverb_python()), str(HERE / "reverb_runner.py")], scens)
    targets: dict[str, dict[str, list[Json]]] = {"engine": run_engine(scens)}
    if not args.no_e2e:
        py = reprise_python()
        if py is None:
            sys.exit("run.py: no Python with reprise installed: set REPRISE_VENV, or pass --no-e2e")
        with tempfile.TemporaryDirectory(prefix="reverbdiff-bin-") as bindir:
            binary = Path(bindir) / "reprised"
            subprocess.run(["go", "build", "-o", str(binary), "./cmd/reprised"], cwd=ROOT, check=True)
            env = {**os.environ, "REPRISED_BIN": str(binary)}
            targets["reprised"] = run_lines([str(py), str(HERE / "reprised_runner.py")], scens, env)
    if args.json:
        Path(args.json).write_text(json.dumps({"reverb": reverb, **targets}, indent=1))

    listed = deliberate_names()
    counts = {"same": 0, "different": 0, "deliberate": 0}
    for s in scens:
        diffs = []
        for name, res in targets.items():
            d = compare(s, reverb[s["name"]], res[s["name"]])
            if d:
                diffs.append(f"{name}: " + "; ".join(d))
        verdict = "same" if not diffs else "deliberate" if s["name"] in listed else "different"
        counts[verdict] += 1
        print(f"{verdict:<11} {s['name']}" + (f"  {' | '.join(diffs)}" if diffs else ""), flush=True)
    print(f"{len(scens)} scenarios: {counts['same']} same, {counts['deliberate']} deliberate, {counts['different']} different")


if __name__ == "__main__":
    main()
