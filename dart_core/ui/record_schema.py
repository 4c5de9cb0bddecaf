"""The schema of an exported run (``RunRecord.to_export``), checked whole when a replay loads.

A replay file comes from anywhere, so :func:`validate_export` checks every field the page reads,
once, before anything is built or drawn: types, ranges, and how the fields fit together (a node
index must name a node of its step's tree, the accepted path must run from the root down the tree,
the answer tokens must be what the steps emitted, ...). A file that passes renders every step; one
that fails raises :class:`ReplayError` naming the place, e.g.

    engine 'dart', step 12: accepted_nodes[3] = 99 is not a node of its 7-node tree

Each record level is a table of fields (name -> required?, check); checks are small functions
``(value, where) -> value``. Cross-field rules follow each table.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from ..engine.trace import STAGES, TRACE_VERSION

EXPORT_FORMAT = "dart-demo-run"
EXPORT_VERSION = 1

TOKEN_MAX = 2**31 - 1       # token ids are int64 in the engine; no vocabulary comes near 2^31
COUNT_MAX = 2**31 - 1       # steps, positions
SPAN_LABELS = ("accepted draft", "target token (bonus)", "target token (prefill)")   # viz.*_LABEL
PROB_SLACK = 1e-4           # float32 probabilities may round a hair above 1


class ReplayError(ValueError):
    """An exported run that cannot be replayed. ``location`` says where (``"engine 'dart', step 12"``,
    ``"token_text"``, ``"line 3"``), ``problem`` what is wrong there."""

    def __init__(self, location: str, problem: str, sep: str = ": "):
        self.location, self.problem, self.sep = location, problem, sep
        super().__init__(f"{location}{sep}{problem}")


Check = Callable[[Any, str], Any]


def _fail(where: str, problem: str):
    """A rule about a record broken: "engine 'dart', step 3: accepted_nodes[1] = 99 is not a node ..."."""
    raise ReplayError(where, problem)


def _bad(where: str, problem: str):
    """A field's value is wrong (``where`` ends with the field): "engine 'dart', step 1: position = -5 is ..."."""
    raise ReplayError(where, problem, " ")


def _field(where: str, name: str) -> str:
    return f"{where}: {name}" if where else name


# ---------------------------------------------------------------------------------------------- leaf checks
def _kind(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(v), "a number" if isinstance(v, (int, float)) else type(v).__name__)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(low: int, high: int) -> Check:
    def check(v: Any, where: str) -> int:
        if not _is_int(v):
            _bad(where, f"must be a whole number, got {_kind(v)} ({_short(v)})")
        if not low <= v <= high:
            _bad(where, f"= {v} is out of range (must be {low}..{high})")
        return v
    return check


def _number(low: float, high: float = math.inf) -> Check:
    def check(v: Any, where: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            _bad(where, f"must be a number, got {_kind(v)} ({_short(v)})")
        if not math.isfinite(v):
            _bad(where, f"must be a finite number, got {v}")
        if not low <= v <= high:
            _bad(where, f"= {v} is out of range (must be {low}..{high})")
        return float(v)
    return check


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        _bad(where, f"must be true or false, got {_kind(v)} ({_short(v)})")
    return v


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        _bad(where, f"must be a string, got {_kind(v)} ({_short(v)})")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:
        _bad(where, f"holds a lone surrogate (U+{ord(v[exc.start]):04X}) at character {exc.start}, which is not "
                     "valid Unicode text")
    return v


def _optional(check: Check) -> Check:
    def opt(v: Any, where: str) -> Any:
        return None if v is None else check(v, where)
    return opt


def _choice(*options: str) -> Check:
    def check(v: Any, where: str) -> str:
        if v not in options or not isinstance(v, str):
            _bad(where, f"must be one of {', '.join(repr(o) for o in options)}, got {_short(v)}")
        return v
    return check


def _list(item: Check, *, min_len: int = 0) -> Check:
    def check(v: Any, where: str) -> list:
        if not isinstance(v, list):
            _bad(where, f"must be a list, got {_kind(v)} ({_short(v)})")
        if len(v) < min_len:
            _bad(where, f"must hold at least {min_len} item{'s' if min_len != 1 else ''}, got {len(v)}")
        return [item(x, f"{where}[{i}]") for i, x in enumerate(v)]
    return check


def _ints(low: int, high: int, *, min_len: int = 0) -> Check:
    """A list of whole numbers in [low, high]; the common case is checked in one pass."""
    one = _int(low, high)

    def check(v: Any, where: str) -> list[int]:
        if not isinstance(v, list):
            _bad(where, f"must be a list, got {_kind(v)} ({_short(v)})")
        if len(v) < min_len:
            _bad(where, f"must hold at least {min_len} item{'s' if min_len != 1 else ''}, got {len(v)}")
        if not all(type(x) is int and low <= x <= high for x in v):
            for i, x in enumerate(v):
                one(x, f"{where}[{i}]")
        return v
    return check


def _numbers(low: float, high: float = math.inf) -> Check:
    one = _number(low, high)

    def check(v: Any, where: str) -> list[float]:
        if not isinstance(v, list):
            _bad(where, f"must be a list, got {_kind(v)} ({_short(v)})")
        if not all(type(x) in (int, float) and low <= x <= high and math.isfinite(x) for x in v):
            for i, x in enumerate(v):
                one(x, f"{where}[{i}]")
        return [float(x) for x in v]
    return check


def _short(v: Any, limit: int = 40) -> str:
    """A bounded preview of a value for a message (no deep repr of nested input)."""
    if isinstance(v, (dict, list)):
        return f"{_kind(v)} of {len(v)} item{'s' if len(v) != 1 else ''}"
    text = repr(v) if not isinstance(v, str) else repr(v[:limit])
    return text if len(text) <= limit + 2 else text[:limit] + "…"


def _record(v: Any, where: str, fields: Mapping[str, tuple[bool, Check, Any]], what: str) -> dict[str, Any]:
    """An object with exactly the declared fields (name -> (required, check, default)), checked."""
    here = where or what
    if not isinstance(v, Mapping):
        _fail(here, f"{what} must be an object, got {_kind(v)} ({_short(v)})")
    unknown = [k for k in v if k not in fields]
    if unknown:
        _fail(here, f"unknown field {_short(unknown[0])} in {what} (known: {', '.join(fields)})")
    out = {}
    for name, (required, check, default) in fields.items():
        if name not in v:
            if required:
                _fail(here, f"{what} lacks the field {name!r}")
            out[name] = default
        else:
            out[name] = check(v[name], _field(where, name))
    return out


# ---------------------------------------------------------------------------------------------- tables
def _tree(v: Any, where: str) -> dict[str, Any]:
    t = _record(v, where, {"tokens": (True, _ints(0, TOKEN_MAX, min_len=1), None),
                           "parents": (True, _ints(-1, COUNT_MAX), None),
                           "depths": (True, _ints(0, COUNT_MAX), None),
                           "scores": (False, _optional(_numbers(-math.inf)), None)}, "tree")
    n = len(t["tokens"])
    for name in ("parents", "depths") + (("scores",) if t["scores"] is not None else ()):
        if len(t[name]) != n:
            _fail(where, f"{name} has {len(t[name])} entries but tokens has {n}")
    par, dep = t["parents"], t["depths"]
    if par[0] != -1 or dep[0] != 0:
        _fail(where, "node 0 must be the root (parents[0] = -1, depths[0] = 0)")
    for i in range(1, n):
        if not 0 <= par[i] < i:
            _fail(where, f"parents[{i}] = {par[i]}: a node's parent must be an earlier node (0..{i - 1})")
        if dep[i] != dep[par[i]] + 1:
            _fail(where, f"depths[{i}] = {dep[i]}, expected its parent's depth + 1 = {dep[par[i]] + 1}")
    return t


CANDIDATE_FIELDS = ("token", "parent", "depth", "logit_term", "ngram_term", "score", "kept", "node")


def _candidates(v: Any, where: str) -> dict[str, Any]:
    c = _record(v, where, {
        "token": (True, _ints(0, TOKEN_MAX), None), "parent": (True, _ints(-1, COUNT_MAX), None),
        "depth": (True, _ints(1, COUNT_MAX), None), "logit_term": (True, _numbers(-math.inf), None),
        "ngram_term": (True, _numbers(-math.inf), None), "score": (True, _numbers(-math.inf), None),
        "kept": (True, _list(_bool), None), "node": (True, _ints(-1, COUNT_MAX), None),
        "source": (False, _ints(0, 7), [])}, "candidates")
    m = len(c["token"])
    for name in CANDIDATE_FIELDS + (("source",) if c["source"] else ()):
        if len(c[name]) != m:
            _fail(where, f"{name} has {len(c[name])} entries but token has {m}")
    return c


def _head_rows(v: Any, where: str) -> dict[str, Any]:
    """DART's parallel logits: equally long rows of target ids and their raw logits, one row per level."""
    r = _record(v, where, {"token": (True, _list(_ints(0, TOKEN_MAX, min_len=1)), None),
                           "logit": (True, _list(_numbers(-math.inf)), None)}, "head_rows")
    if len(r["token"]) != len(r["logit"]):
        _fail(where, f"head_rows has {len(r['token'])} token rows but {len(r['logit'])} logit rows")
    for i, (t, x) in enumerate(zip(r["token"], r["logit"])):
        if len(t) != len(x):
            _fail(where, f"head_rows level {i + 1}: {len(t)} tokens but {len(x)} logits")
    return r


def _timings(v: Any, where: str) -> dict[str, float]:
    if not isinstance(v, Mapping):
        _bad(where, f"must be an object of stage -> seconds, got {_kind(v)} ({_short(v)})")
    out = {}
    for k, x in v.items():
        if k not in STAGES:
            _bad(where, f"has an unknown stage {_short(k)} (stages: {', '.join(STAGES)})")
        out[k] = _number(0.0)(x, f"{where}[{k!r}]")
    return out


TRACE_FIELDS: dict[str, tuple[bool, Check, Any]] = {
    "step": (True, _int(1, COUNT_MAX), None),
    "position": (True, _int(0, COUNT_MAX), None),
    "tree": (True, _tree, None),
    "accepted_nodes": (True, _ints(0, COUNT_MAX, min_len=1), None),
    "emitted_tokens": (True, _ints(0, TOKEN_MAX, min_len=1), None),
    "bonus_token": (True, _int(0, TOKEN_MAX), None),
    "node_target_prob": (True, _numbers(0.0, 1.0 + PROB_SLACK), None),
    "node_target_argmax": (True, _ints(0, TOKEN_MAX), None),
    "timings": (True, _timings, None),
    "candidates": (False, _optional(_candidates), None),
    "mode": (False, _choice("greedy", "sampling"), "greedy"),
    "stop_reason": (False, _optional(_str), None),
    "version": (True, _int(0, COUNT_MAX), None),
    "head_rows": (False, _optional(_head_rows), None),
}


def _trace(v: Any, where: str) -> dict[str, Any]:
    if isinstance(v, Mapping) and "version" in v and v["version"] != TRACE_VERSION:
        _fail(where, f"trace version {_short(v['version'])} is not supported (this app reads version "
                     f"{TRACE_VERSION}): re-export the run with this version of the app")
    t = _record(v, where, TRACE_FIELDS, "the step")
    tree = t["tree"]
    n = len(tree["tokens"])
    for name in ("node_target_prob", "node_target_argmax"):
        if len(t[name]) != n:
            _fail(where, f"{name} has {len(t[name])} entries, one per node of its {n}-node tree expected")
    path = t["accepted_nodes"]
    for i, node in enumerate(path):
        if node >= n:
            _fail(where, f"accepted_nodes[{i}] = {node} is not a node of its {n}-node tree")
    if path[0] != 0:
        _fail(where, f"accepted_nodes[0] = {path[0]}: the accepted path starts at the root (node 0)")
    for i in range(1, len(path)):
        if tree["parents"][path[i]] != path[i - 1]:
            _fail(where, f"accepted_nodes[{i}] = {path[i]} is not a child of node {path[i - 1]} "
                         f"(accepted_nodes[{i - 1}]): the accepted path runs from the root down the tree")
    emitted = t["emitted_tokens"]
    if len(emitted) > len(path):
        _fail(where, f"emitted_tokens has {len(emitted)} tokens, but {len(path) - 1} accepted drafts + 1 bonus "
                     f"token make at most {len(path)}")
    for i, tok in enumerate(emitted):
        want = tree["tokens"][path[i + 1]] if i + 1 < len(path) else t["bonus_token"]
        if tok != want:
            what = f"the token of accepted node {path[i + 1]}" if i + 1 < len(path) else "bonus_token"
            _fail(where, f"emitted_tokens[{i}] = {tok} differs from {what} ({want})")
    c = t["candidates"]
    if c is not None:
        for i in range(len(c["token"])):
            p, node = c["parent"][i], c["node"][i]
            if p >= i:
                _fail(where, f"candidates.parent[{i}] = {p}: a candidate's parent must be an earlier candidate "
                             f"(-1 = the root)")
            if c["depth"][i] != (1 if p < 0 else c["depth"][p] + 1):
                _fail(where, f"candidates.depth[{i}] = {c['depth'][i]}, expected its parent's depth + 1")
            if node == 0 or node >= n:
                _fail(where, f"candidates.node[{i}] = {node} is not a drafted node of its {n}-node tree "
                             "(-1 = pruned)")
            if c["kept"][i] != (node >= 0):
                _fail(where, f"candidates.kept[{i}] = {str(c['kept'][i]).lower()} but candidates.node[{i}] = {node} "
                             "(kept candidates, and only they, are tree nodes)")
            if node > 0 and (tree["tokens"][node] != c["token"][i] or tree["depths"][node] != c["depth"][i]):
                _fail(where, f"candidates[{i}] (token {c['token'][i]}, depth {c['depth'][i]}) is not tree node "
                             f"{node} (token {tree['tokens'][node]}, depth {tree['depths'][node]})")
    return t


def _spans(v: Any, where: str) -> list[tuple[str, str]]:
    if not isinstance(v, list):
        _bad(where, f"must be a list of [text, label] pairs, got {_kind(v)} ({_short(v)})")
    out = []
    for i, s in enumerate(v):
        w = f"{where}[{i}]"
        if not isinstance(s, list) or len(s) != 2:
            _bad(w, f"must be a [text, label] pair, got {_short(s)}")
        text, label = _str(s[0], w), _str(s[1], w)
        if label not in SPAN_LABELS:
            _bad(w, f"has the label {_short(label)}, not one of {', '.join(repr(x) for x in SPAN_LABELS)}")
        out.append((text, label))
    return out


ENGINE_FIELDS: dict[str, tuple[bool, Check, Any]] = {
    "tokens": (False, _ints(0, TOKEN_MAX), []),
    "busy_s": (False, _number(0.0), 0.0),
    "done": (False, _bool, True),
    "stop_reason": (False, _optional(_str), None),
    "error": (False, _optional(_str), None),
    "variant": (False, _optional(_choice("paper", "+ context")), None),   # ui/session.py engine_variant's
    "spans": (False, _optional(_spans), None),
    "traces": (False, _list(lambda v, w: v), []),   # each trace is checked by _trace, with its step in the place
}


def _engine(name: str, v: Any, greedy: bool) -> dict[str, Any]:
    where = f"engine {name!r}"
    e = _record(v, where, ENGINE_FIELDS, "the engine")
    traces = []
    tokens = e["tokens"]
    for k, raw in enumerate(e["traces"]):
        w = f"{where}, step {k + 1}"
        t = _trace(raw, w)
        if t["step"] != k + 1:
            _fail(w, f"step = {t['step']}, expected {k + 1} (the steps of a run are numbered 1, 2, ... in order)")
        if t["mode"] != ("greedy" if greedy else "sampling"):
            _fail(w, f"mode is {t['mode']!r} but the run is {'greedy' if greedy else 'sampling'} "
                     f"(\"greedy\": {str(greedy).lower()})")
        end = 1 if not traces else traces[-1]["position"] + len(traces[-1]["emitted_tokens"])
        if t["position"] != end:
            _fail(w, f"position = {t['position']}, expected {end} (each step starts where the previous one ended; "
                     "the first at answer token 1, after the prefill's token)")
        last = t["position"] + len(t["emitted_tokens"])
        if last > len(tokens):
            _fail(w, f"emits answer tokens {t['position']}..{last - 1} but the engine's tokens hold only {len(tokens)}")
        if tokens[t["position"] - 1] != t["tree"]["tokens"][0]:
            _fail(w, f"the tree's root token {t['tree']['tokens'][0]} is not the last answer token before the step "
                     f"(tokens[{t['position'] - 1}] = {tokens[t['position'] - 1]})")
        if tokens[t["position"]:last] != t["emitted_tokens"]:
            _fail(w, f"emitted_tokens differ from the engine's tokens[{t['position']}:{last}]")
        traces.append(t)
    covered = traces[-1]["position"] + len(traces[-1]["emitted_tokens"]) if traces else min(len(tokens), 1)
    if len(tokens) != covered:
        _fail(where, f"tokens holds {len(tokens)} answer tokens but its steps produced {covered} (the prefill's token "
                     "and each step's emitted tokens)")
    e["traces"] = traces
    return e


def _meta_value(v: Any, where: str) -> Any:
    if isinstance(v, Mapping):
        return {_str(k, where): _scalar(x, f"{where}[{k!r}]") for k, x in v.items()}
    return _scalar(v, where)


def _scalar(v: Any, where: str) -> Any:
    if v is None or isinstance(v, bool) or _is_int(v):
        return v
    if isinstance(v, float):
        return _number(-math.inf)(v, where)
    if isinstance(v, str):
        return _str(v, where)
    _bad(where, f"must be text, a number, true/false or null, got {_kind(v)} ({_short(v)})")


def _meta(v: Any, where: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        _bad(where, f"must be an object, got {_kind(v)} ({_short(v)})")
    return {_str(k, where): _meta_value(x, f"{where}[{k!r}]") for k, x in v.items()}


def _token_text(v: Any, where: str) -> dict[int, str]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        _bad(where, f"must be an object of token id -> text, got {_kind(v)} ({_short(v)})")
    out = {}
    for k, text in v.items():
        if not (isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 10 and int(k) <= TOKEN_MAX):
            _bad(where, f"has a key {_short(k)} that is not a token id (a whole number 0..{TOKEN_MAX} written as text)")
        out[int(k)] = _str(text, f"{where}[{k!r}]")
    return out


RUN_FIELDS: dict[str, tuple[bool, Check, Any]] = {
    "format": (True, lambda v, w: v, None),
    "version": (True, lambda v, w: v, None),
    "prompt": (False, _optional(_str), ""),
    "greedy": (False, _bool, True),
    "baseline": (False, _str, "vanilla"),
    "meta": (False, _meta, {}),
    "token_text": (False, _token_text, {}),
    "engines": (True, lambda v, w: v, None),
}


def validate_export(data: Any) -> dict[str, Any]:
    """Check a parsed export whole; returns it normalised (defaults filled in, token_text keyed by int,
    spans as tuples). Raises ReplayError naming the first place that is wrong."""
    try:
        return _validate(data)
    except ReplayError as exc:
        if "re-export" in exc.problem or "choose a file" in exc.problem:
            raise
        raise ReplayError(exc.location, f"{exc.problem}. The file is damaged or was edited: re-export the run "
                                        "with \"Export traces\"", exc.sep) from None


def _validate(data: Any) -> dict[str, Any]:
    if not isinstance(data, Mapping) or data.get("format") != EXPORT_FORMAT:
        _fail("format", f"this is not a DART demo trace export (expected \"format\": \"{EXPORT_FORMAT}\"): "
                        "choose a file saved with \"Export traces\"")
    if data.get("version") != EXPORT_VERSION:
        _fail("version", f"trace export version {_short(data.get('version'))} is not supported (this app reads "
                         f"version {EXPORT_VERSION}): re-export the run with this version of the app")
    run = _record(data, "", RUN_FIELDS, "the file")
    run["prompt"] = run["prompt"] or ""
    engines = run["engines"]
    if not isinstance(engines, Mapping):
        _bad("engines", f"must be an object of engine name -> run, got {_kind(engines)} ({_short(engines)})")
    if not engines:
        _fail("engines", "the file holds no engine runs")
    out = {}
    for name, e in engines.items():
        if not isinstance(name, str) or not name.strip():
            _fail("engines", f"engine name {_short(name)} must be a non-empty string")
        _str(name, "engines")
        out[name] = _engine(name, e, run["greedy"])
    run["engines"] = out
    return run
