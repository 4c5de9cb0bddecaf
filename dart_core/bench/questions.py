"""Benchmark questions: Spec-Bench question files and the named sets that resolve without a path.

A question file holds one JSON object per line, ``{"question_id": ..., "category": ..., "turns": [user turn, ...]}``
(Spec-Bench's and MT-bench's format). ``--questions`` takes file paths or names of ``QUESTION_SETS``:

    python -m dart_core.bench --questions mt_bench humaneval gsm8k alpaca --data-dir DIR

A name resolves, first match wins, from

1. ``--data-dir DIR`` or ``DART_DATA_DIR``: ``DIR/<local file>`` (``mt_bench.jsonl``, ``humaneval.jsonl``,
   ``gsm8k_test.jsonl``, ``alpaca.jsonl``);
2. the Hugging Face cache: the set's pinned Hub file, if it was downloaded before;
3. the Hub, only when online (``HF_HUB_OFFLINE`` unset): the pinned file, downloaded into the cache.

The Hub files are not always the same questions as the local files, nor always in the same format
(see each row's ``note``); a report names the file it read (``settings.question_sources``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Sequence

from ..data_sources import ENV_DATA_DIR, DataSourceError, HubFile, env_data_dir, hub_file, hub_offline


class BenchInputError(ValueError):
    """A question file or a flag is wrong; the message names the file/line or the flag."""


# ---------------------------------------------------------------------------------------------- named sets
@dataclass(frozen=True)
class QuestionSet:
    """A named question set: its file name in a data folder and where the Hub holds it (None: nowhere found).

    ``hub_prompt_category``: None when the Hub file holds Spec-Bench lines; else the file holds
    ``{"prompt": "..."}`` lines (one single-turn question each), read as questions ``<name>/<index>`` of
    this category.
    """
    name: str
    local_file: str
    hub: HubFile | None
    hub_prompt_category: str | None = None
    note: str = ""


class QuestionSource(NamedTuple):
    """A resolved ``--questions`` entry: the file, the set's name in the report, and how its lines read."""
    path: Path
    name: str
    prompt_category: str | None = None    # None: Spec-Bench lines; else {"prompt": ...} lines of this category


# MT-bench as FastChat publishes it (question_id, category, both turns: the Spec-Bench format) in LMSYS's
# Space; pinned to the named revision ``main``, as no commit sha of that Space could be confirmed here.
_MT_BENCH = HubFile("lmsys/mt-bench", "data/mt_bench/question.jsonl", "main", repo_type="space")
# Red Hat AI's speculative-decoding splits (HumanEval, MIT; Spec-Bench's tasks, Apache-2.0): one
# {"prompt": "..."} object per line. The commit is the one a public evaluation script pins for this dataset
# (it reads HumanEval.jsonl and math_reasoning.jsonl at it); it was not checked against the Hub from here.
_RED_HAT_SPLITS = "RedHatAI/speculator_benchmarks"
_RED_HAT_COMMIT = "2ae86affa2cb97a972b7fc681dd51c04fbff083e"

QUESTION_SETS: dict[str, QuestionSet] = {s.name: s for s in (
    QuestionSet("mt_bench", "mt_bench.jsonl", _MT_BENCH, None,
                "Hub: FastChat's question.jsonl (80 questions, 2 turns; integer ids)"),
    QuestionSet("humaneval", "humaneval.jsonl", HubFile(_RED_HAT_SPLITS, "HumanEval.jsonl", _RED_HAT_COMMIT), "code",
                "Hub: the 164 HumanEval prompts (function signature + docstring, not wrapped in an instruction)"),
    QuestionSet("gsm8k", "gsm8k_test.jsonl", HubFile(_RED_HAT_SPLITS, "math_reasoning.jsonl", _RED_HAT_COMMIT),
                "math", "Hub: Spec-Bench's math_reasoning split (80 GSM8K test questions, not all 1,319)"),
    QuestionSet("alpaca", "alpaca.jsonl", None, None,
                "no public Hub copy found: a data folder (--data-dir / DART_DATA_DIR) only"),
    QuestionSet("context_dev", "context_dev.jsonl", None, None,
                "prompts that lean on their own text (translation, questions over a passage, summaries; 60 each): "
                "a data folder only"),
)}


def _download_hint(qs: QuestionSet) -> str:
    if qs.hub is None:
        return f" ({qs.name} has no Hub source)"
    return f", or fetch it once with `{qs.hub.download_command()}` (then it is read from the cache)"


def resolve_question_set(name: str, data_dir: str | Path | None = None) -> QuestionSource:
    """The file of the named set ``name`` (see the module docstring for the order); BenchInputError when none."""
    qs = QUESTION_SETS[name]
    looked: list[str] = []
    folder = Path(data_dir).expanduser() if data_dir is not None else env_data_dir()
    if folder is not None:
        candidate = folder / qs.local_file
        if candidate.is_file():
            return QuestionSource(candidate, name)
        looked.append(f"{candidate} ({'--data-dir' if data_dir is not None else ENV_DATA_DIR})")
    if qs.hub is not None:
        try:
            found = hub_file(qs.hub)
        except DataSourceError as exc:
            raise BenchInputError(f"question set {name!r}: {exc} (--questions)") from None
        if found is not None:
            return QuestionSource(found, name, qs.hub_prompt_category)
        looked.append(f"the Hugging Face cache ({qs.hub})")
    where = "; looked in " + ", ".join(looked) if looked else ""
    offline = " (offline: HF_HUB_OFFLINE is set)" if hub_offline() and qs.hub is not None else ""
    raise BenchInputError(
        f"question set {name!r} not found{where}{offline}. Point --data-dir DIR or {ENV_DATA_DIR}=DIR at a folder "
        f"holding {qs.local_file}{_download_hint(qs)}, or pass a file path to --questions")


def resolve_question_source(entry: str | Path, data_dir: str | Path | None = None) -> QuestionSource:
    """A ``--questions`` entry -> its source. An existing file wins; a name of QUESTION_SETS resolves."""
    path = Path(entry)
    if path.is_file():
        return QuestionSource(path, path.stem)
    text = str(entry)
    if text in QUESTION_SETS:
        return resolve_question_set(text, data_dir)
    if "/" not in text and "\\" not in text and not path.suffix:
        raise BenchInputError(f"{text!r} is neither a question file nor a named set; the named sets are "
                              f"{', '.join(QUESTION_SETS)} (--questions)")
    raise BenchInputError(f"question file {path} does not exist (--questions)")


# ---------------------------------------------------------------------------------------------- files
@dataclass
class Question:
    question_id: str
    category: str
    turns: list[str]
    question_set: str = ""            # the question file's stem (mt_bench, humaneval, ...)


def load_questions(path: str | Path, limit: int | None = None, question_set: str | None = None,
                   prompt_category: str | None = None) -> list[Question]:
    """Read a Spec-Bench question file (JSON lines); errors name the file and the line.
    ``question_set`` names the set in the report (default: the file's stem). With ``prompt_category`` the
    lines are ``{"prompt": "..."}`` objects instead (a named set's Hub file, see QuestionSet)."""
    path = Path(path)
    if not path.is_file():
        raise BenchInputError(f"question file {path} does not exist (--questions)")
    questions: list[Question] = []
    seen: dict[str, int] = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchInputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); each line "
                                      "must be one JSON object") from None
            if prompt_category is not None:
                prompt = row.get("prompt") if isinstance(row, dict) else None
                if not isinstance(prompt, str) or not prompt:
                    raise BenchInputError(f"{where}: expected a JSON object with a non-empty prompt string")
                qid = f"{question_set or path.stem}/{len(questions)}"
                questions.append(Question(qid, prompt_category, [prompt], question_set=question_set or path.stem))
                if limit is not None and len(questions) >= limit:
                    break
                continue
            if not isinstance(row, dict):
                raise BenchInputError(f"{where}: expected a JSON object with question_id, category and turns, "
                                      f"got {type(row).__name__}")
            missing = [k for k in ("question_id", "category", "turns") if k not in row]
            if missing:
                raise BenchInputError(f"{where}: missing field(s) {', '.join(missing)}; Spec-Bench lines look like "
                                      '{"question_id": 81, "category": "writing", "turns": ["..."]}')
            qid = row["question_id"]
            if isinstance(qid, bool) or not isinstance(qid, (str, int)):
                raise BenchInputError(f"{where}: question_id must be a string or an integer, got {qid!r}")
            qid = str(qid)
            if qid in seen:
                raise BenchInputError(f"{where}: question_id {qid!r} repeats line {seen[qid]}; ids must be unique")
            seen[qid] = lineno
            if not isinstance(row["category"], str):
                raise BenchInputError(f"{where}: category must be a string, got {row['category']!r}")
            turns = row["turns"]
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
                raise BenchInputError(f"{where}: turns must be a non-empty list of non-empty strings "
                                      "(the user turns)")
            questions.append(Question(qid, row["category"], list(turns),
                                       question_set=question_set or path.stem))
            if limit is not None and len(questions) >= limit:
                break
    if not questions:
        raise BenchInputError(f"question file {path} holds no questions")
    return questions


def load_question_sets(entries: Sequence[str | Path | QuestionSource], limit: int | None = None,
                       data_dir: str | Path | None = None, per_category: int | None = None) -> list[Question]:
    """Several question files or named sets in one run (``limit`` applies to each; ``per_category`` keeps the
    first K questions of each category of each); ids must be unique across them. An entry is a path, a set name,
    or an already resolved QuestionSource."""
    questions: list[Question] = []
    seen: dict[str, str] = {}
    for entry in entries:
        src = entry if isinstance(entry, QuestionSource) else resolve_question_source(entry, data_dir)
        path = src.path
        loaded = load_questions(path, limit, question_set=src.name, prompt_category=src.prompt_category)
        if per_category is not None:
            taken: dict[str, int] = {}
            kept = []
            for q in loaded:
                if taken.get(q.category, 0) < per_category:
                    taken[q.category] = taken.get(q.category, 0) + 1
                    kept.append(q)
            loaded = kept
        for q in loaded:
            if q.question_id in seen:
                raise BenchInputError(f"question_id {q.question_id!r} of {path} is also in {seen[q.question_id]}; "
                                      "ids must be unique across the --questions files")
            seen[q.question_id] = str(path)
            questions.append(q)
    return questions
