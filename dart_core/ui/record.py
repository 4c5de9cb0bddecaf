"""What a comparison recorded, and its export / replay (no Gradio here).

A :class:`RunRecord` holds every engine's answer tokens, StepTraces and timing; the page renders only
this, so a live run (dart_core.ui.session.Comparison) and a replayed export render through one code path.

    export = record.to_export()             # JSON-able; token texts included, so a replay needs no tokenizer
    record = RunRecord.from_export(path)    # checked whole against dart_core.ui.record_schema first
    record.metrics()["dart"].tau, record.spans("dart")
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..engine.trace import StepTrace
from ..engine.trace_stats import PREFILL_LABEL, TraceLike, token_origins
from ..models.detok import incremental_texts
from .record_schema import EXPORT_FORMAT, EXPORT_VERSION, ReplayError, validate_export

#: The engine every comparison measures against (plain target decoding, no drafts).
BASELINE = "vanilla"
#: Column order and display names of the engines the app knows.
ENGINE_LABELS: dict[str, str] = {"dart": "DART", "eagle3": "EAGLE-3", "vanilla": "Vanilla (baseline)"}

Decode = Callable[[list[int]], str]


#: Stop reasons of a run cut short (the page's Stop, its serving limits, an engine error): its answer is a prefix of
#: the one it would have given. Every other reason is the engine's own end (EOS, a length limit).
STOPPED, TIME_LIMIT, MEMORY_LIMIT = "stopped", "time limit", "memory limit"
CUT_SHORT = (STOPPED, TIME_LIMIT, MEMORY_LIMIT, "error")


def label_of(name: str, variant: str | None = None) -> str:
    """The engine's name on the page; ``variant`` says which of its methods ran ("paper", "+ context")."""
    label = ENGINE_LABELS.get(name, name)
    if not variant:
        return label
    return f"{label} {variant}" if variant.startswith("+") else f"{label} ({variant})"


def token_spans(steps: Sequence[TraceLike], decode: Any) -> list[tuple[str, str]]:
    """(text, label) per answer token for ``gr.HighlightedText(color_map=viz.SPAN_COLORS)``.

    Labels come from the trace (accepted draft vs the target's token), never from searching
    the text. ``decode``: a callable ids -> text or a tokenizer (special tokens skipped, so an
    EOS gives an empty span). A character split over several tokens goes whole to the token
    that completes it (dart_core.models.detok).
    """
    if decode is None:
        raise ValueError("token_spans needs a decode callable or a tokenizer")
    if not hasattr(decode, "decode") and not callable(decode):
        raise TypeError(f"tokenizer must be None, a callable list[int] -> str, or have .decode(); "
                        f"got {type(decode).__name__}")
    tokens, labels = token_origins(steps)
    return list(zip(incremental_texts(tokens, decoder_fn(decode)), labels))


@dataclass
class EngineRun:
    """What one engine has produced so far in a comparison (live) or a recorded run (replay).

    tokens   answer tokens (the first comes from the prefill; EOS included when reached)
    busy_s   seconds spent inside this engine's own work (prefill + steps), never UI or other engines
    spans    recorded (text, label) spans; None = computed from the traces with the decoder
    tree_labels  per step (live runs only, not exported): the tree setting an automatic-tree drafter chose
                 for it (dart_core.sizing.AutoTree, e.g. "budget 3"), None for a fixed tree
    """
    name: str
    tokens: list[int] = field(default_factory=list)
    traces: list[StepTrace] = field(default_factory=list)
    busy_s: float = 0.0
    done: bool = False
    stop_reason: str | None = None
    error: str | None = None
    spans: list[tuple[str, str]] | None = None
    tree_labels: list[str | None] = field(default_factory=list)
    variant: str | None = None      # which of the engine's methods ran: "paper" or "+ context" (DART, EAGLE-3)

    @property
    def label(self) -> str:
        return label_of(self.name, self.variant)

    @property
    def steps(self) -> int:
        return len(self.traces)

    @property
    def finished(self) -> bool:
        """Ended by the engine itself (EOS or a length limit), not cut short by Stop, a limit or an error."""
        return self.done and self.stop_reason not in CUT_SHORT and not self.error

    def tree_label(self, k: int) -> str | None:
        """The automatic tree setting of step index ``k`` (None: a fixed tree, or a replayed run)."""
        return self.tree_labels[k] if 0 <= k < len(self.tree_labels) else None

    @property
    def tau(self) -> float | None:
        """Tokens per verify step, bonus included (prefill token excluded), as GenerationStats."""
        return (len(self.tokens) - 1) / len(self.traces) if self.traces else None

    @property
    def tokens_per_s(self) -> float | None:
        return len(self.tokens) / self.busy_s if self.busy_s > 0 and self.tokens else None

    def add_step(self, trace: StepTrace, tree_label: str | None = None) -> None:
        if not self.traces:
            self.tokens.append(int(trace.tree.tokens[0]))  # the prefill's token is step 1's root
        self.traces.append(trace)
        self.tree_labels.append(tree_label)
        self.tokens.extend(int(t) for t in trace.emitted_tokens)


@dataclass
class EngineMetrics:
    tokens: int
    steps: int
    tau: float | None
    tokens_per_s: float | None
    speedup: float | None           # tokens/s over the baseline's, both from this run
    lossless: str                   # "identical", "same so far", "differs", "n/a", "pending"
    lossless_text: str              # one line for the page


def lossless_check(run: EngineRun, base: EngineRun, greedy: bool, dtype: str | None = None) -> tuple[str, str]:
    """Whether ``run``'s answer equals the baseline's (greedy decoding only)."""
    if run.name == base.name:
        return "n/a", "this is the baseline"
    if not greedy:
        return "n/a", ("sampling (temperature > 0): answers differ by design; speculative sampling is "
                       "lossless in distribution, not token by token")
    a, b = run.tokens, base.tokens
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), None)
    if first is None and run.finished and base.finished and len(a) != len(b):
        first = n          # both ended by themselves, one earlier: the longer one went on past an EOS
    if first is not None:
        hint = ""
        if dtype and "float32" not in str(dtype):
            hint = (f" ({dtype}: differently shaped matmuls can flip a near-tie argmax; start with --dtype "
                    "float32 for exact equality)")
        return "differs", f"differs from the baseline at token {first}{hint}"
    if run.finished and base.finished:
        return "identical", f"identical to the baseline ({len(a)} tokens)"
    if n == 0:
        return "pending", "waiting for tokens"
    cut = [r for r in (run, base) if r.done and not r.finished]
    if cut:   # a run cut short is compared on the tokens it produced: a prefix is no difference
        who = "this run" if cut[0] is run else "the baseline"
        why = "an error" if cut[0].error else (cut[0].stop_reason or "a stop")
        return "same so far", f"same as the baseline for the {n} tokens before {who} was stopped ({why})"
    return "same so far", f"same as the baseline so far ({n} tokens)"


def decoder_fn(decode: Any) -> Decode:
    if decode is None:
        return lambda ids: " ".join(f"#{i}" for i in ids)
    if hasattr(decode, "decode"):
        return lambda ids: decode.decode(list(ids), skip_special_tokens=True)
    return decode


_TRACE_OVERHEAD = 2048    # bytes of one StepTrace besides its arrays (objects, dicts, small lists)


def _seq_nbytes(x: Any) -> int:
    """Estimated bytes of an array or list of numbers: numpy's own count, else a pointer plus a boxed number
    (about 36 bytes) per element."""
    if x is None:
        return 0
    nbytes = getattr(x, "nbytes", None)
    if nbytes is not None:
        return int(nbytes)
    return 56 + 36 * len(x)


@dataclass
class RunRecord:
    """A comparison's runs plus what is needed to render them: the page renders only this.

    decode   a tokenizer or a callable ids -> text (replays use the recorded token texts)
    """
    runs: dict[str, EngineRun]
    decode: Any
    prompt: str = ""
    greedy: bool = True
    baseline: str = BASELINE
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def speculative(self) -> list[str]:
        return [n for n in self.runs if n != self.baseline]

    @property
    def done(self) -> bool:
        return all(r.done for r in self.runs.values())

    def text(self, name: str) -> str:
        run = self.runs[name]
        return "".join(t for t, _ in self.spans(name)) if run.spans is not None else \
            decoder_fn(self.decode)(run.tokens)

    def spans(self, name: str) -> list[tuple[str, str]]:
        """(text, label) per answer token, labelled from the trace (accepted draft vs target token)."""
        run = self.runs[name]
        if run.spans is not None:
            return list(run.spans)
        if run.traces:
            return token_spans(run.traces, self.decode)
        if run.tokens:  # stopped right after the prefill
            return [(decoder_fn(self.decode)(run.tokens), PREFILL_LABEL)]
        return []

    def metrics(self) -> dict[str, EngineMetrics]:
        base = self.runs.get(self.baseline)
        base_tps = base.tokens_per_s if base is not None else None
        out = {}
        for name, run in self.runs.items():
            tps = run.tokens_per_s
            speedup = tps / base_tps if tps and base_tps else None
            if base is None:
                state, text = "n/a", "no baseline in this run"
            else:
                state, text = lossless_check(run, base, self.greedy, self.meta.get("dtype"))
            out[name] = EngineMetrics(tokens=len(run.tokens), steps=run.steps, tau=run.tau, tokens_per_s=tps,
                                      speedup=speedup, lossless=state, lossless_text=text)
        return out

    def nbytes(self) -> int:
        """Estimated bytes this record holds (its traces dominate: every scored candidate is kept)."""
        total = 0
        for run in self.runs.values():
            total += _seq_nbytes(run.tokens) + (150 * len(run.spans) if run.spans is not None else 0)
            for st in run.traces:
                total += _TRACE_OVERHEAD + sum(_seq_nbytes(x) for x in (
                    st.tree.tokens, st.tree.parents, st.tree.depths, st.tree.scores, st.accepted_nodes,
                    st.emitted_tokens, st.node_target_prob, st.node_target_argmax))
                if st.candidates is not None:
                    total += sum(_seq_nbytes(getattr(st.candidates, f)) for f in st.candidates.__dataclass_fields__)
                if st.head_rows is not None:
                    total += sum(_seq_nbytes(np.asarray(v).ravel()) for v in st.head_rows.values())
        return total

    def max_position(self) -> int:
        """Highest answer-token position any engine reached (0 when nothing was produced)."""
        return max((len(r.tokens) - 1 for r in self.runs.values()), default=0) if self.runs else 0

    # ------------------------------------------------------------------ export / replay
    def to_export(self) -> dict[str, Any]:
        """A JSON-able dict of the whole run. Token texts are stored (spans per answer, and the text of
        every token the traces mention) so a replay needs neither the model nor its tokenizer."""
        decode = decoder_fn(self.decode)
        seen: set[int] = set()
        engines = {}
        for name, run in self.runs.items():
            seen.update(run.tokens)
            for st in run.traces:
                seen.update(int(t) for t in st.tree.tokens)
                seen.add(int(st.bonus_token))
                seen.update(int(t) for t in st.node_target_argmax)
                if st.candidates is not None:
                    seen.update(int(t) for t in st.candidates.token)
                if st.head_rows is not None:
                    seen.update(int(t) for t in np.asarray(st.head_rows["token"]).ravel())
            engines[name] = {"tokens": list(run.tokens), "busy_s": run.busy_s, "done": run.done,
                             "stop_reason": run.stop_reason, "error": run.error, "variant": run.variant,
                             "spans": [list(s) for s in self.spans(name)],
                             "traces": [st.to_dict() for st in run.traces]}
        # Single-token texts label tree nodes; special tokens keep their names there (e.g. <|im_end|>).
        raw = (self.decode.decode if hasattr(self.decode, "decode") else decode)
        token_text = {str(t): raw([t]) for t in sorted(seen)}
        return {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "prompt": self.prompt, "greedy": self.greedy,
                "baseline": self.baseline, "meta": dict(self.meta), "token_text": token_text, "engines": engines}

    def to_json(self) -> str:
        return json.dumps(self.to_export(), ensure_ascii=False)

    @classmethod
    def from_export(cls, data: Mapping[str, Any] | str | bytes | Path) -> "RunRecord":
        """Read an exported run (a dict, JSON text/bytes, or a file path). The whole record is checked once
        here (dart_core.ui.record_schema), so a record that loads renders every step. Raises ReplayError (a
        ValueError) that says where the file is wrong and what to do; OSError when a path cannot be read."""
        if isinstance(data, Path):
            data = data.read_bytes()
        if isinstance(data, bytes):
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ReplayError(f"byte {exc.start}", "the trace file is not UTF-8 JSON: choose a file saved with "
                                  "\"Export traces\"") from None
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as exc:
                raise ReplayError(f"line {exc.lineno}, column {exc.colno}", f"the trace file is not valid JSON "
                                  f"({exc.msg}): choose a file saved with \"Export traces\"") from None
            except RecursionError:
                raise ReplayError("the file", "the JSON is nested too deeply to be a trace export: choose a file "
                                  "saved with \"Export traces\"") from None
            except ValueError as exc:  # e.g. an integer with more digits than Python converts
                raise ReplayError("the file", f"the trace file is not a usable JSON document ({exc}): choose a "
                                  "file saved with \"Export traces\"") from None
        try:
            run = validate_export(data)
        except RecursionError:  # a nested dict handed in directly (files are caught above)
            raise ReplayError("the record", "it is nested too deeply to be a trace export") from None
        runs: dict[str, EngineRun] = {}
        for name, e in run["engines"].items():
            traces = [StepTrace.from_dict(t) for t in e["traces"]]
            runs[name] = EngineRun(name=name, tokens=list(e["tokens"]), traces=traces, busy_s=e["busy_s"],
                                   done=e["done"], stop_reason=e["stop_reason"], error=e["error"], spans=e["spans"],
                                   variant=e["variant"])
        return cls(runs=runs, decode=TokenTextDecoder(run["token_text"]), prompt=run["prompt"],
                   greedy=run["greedy"], baseline=run["baseline"], meta=run["meta"])


class TokenTextDecoder:
    """Decodes ids with a recorded {id: text} table (replays run without the tokenizer)."""

    def __init__(self, texts: Mapping[int, str]):
        self.texts = dict(texts)

    def __call__(self, ids: Sequence[int]) -> str:
        return "".join(self.texts.get(int(i), f"#{int(i)}") for i in ids)


def save_export(record: RunRecord, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(record.to_json(), encoding="utf-8")
    return path
