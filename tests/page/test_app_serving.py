"""What one visitor may cost the app's server, and runs that never share an engine.

- Stop pressed while a run (or step) still waits in Gradio's queue: the request starts and stops at once.
- The serving limits of dart_core/ui/serving.py (upload size, nodes per replayed step, run wall time and tokens
  when hosted, the tabs' memory budget, queue size, file clean-up): defined once, documented in README.md,
  applied, and named on the page when one stops a run.
- Engine ownership: a run leases its engines, so two runs interleaved in one process give the answers they
  give alone, and an engine refuses a second open generation.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import app  # noqa: E402
from dart_core.page.controls import SETTING_NAMES  # noqa: E402
from dart_core.page import handlers  # noqa: E402
from dart_core.ui.record import TIME_LIMIT  # noqa: E402
from dart_core.page.serve import launch_kwargs  # noqa: E402
from dart_core.page.tabs import TabState  # noqa: E402
from dart_core.page.visualiser import Visualiser  # noqa: E402
from dart_core.ui import serving  # noqa: E402
from dart_core.ui.record import RunRecord  # noqa: E402
from dart_core.ui.session import Comparison, RunSettings  # noqa: E402
from dart_core.engine.decoding import EngineBusyError, SpeculativeEngine  # noqa: E402
from gradio_server import launch_local  # noqa: E402
from tiny_models import tiny_app_argv  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "data" / "recorded_run.json"
PROMPT = "Write a Python function."
OTHER = "Name three colours."
# page values in SETTING_NAMES order (small trees keep the tiny model fast)
VALUES = (12, 0.0, 1.0, 0, 16, 6, 6, 0.5, 0.0, 16, 3, 4, 0.0)
OTHER_VALUES = (10, 0.0, 1.0, 0, 8, 4, 4, 0.5, 0.0, 8, 2, 3)
FIXED = VALUES + ("fixed",)   # the same settings with fixed trees (tree sizes that do not follow timings)


@pytest.fixture(scope="module")
def tiny(tiny_app_models):
    target, *dirs = tiny_app_models
    return target, app.parse_args(tiny_app_argv(*dirs, max_new_tokens=32))


def make_vis(tiny, **limits) -> Visualiser:
    target, args = tiny
    return Visualiser(target, args, limits=dataclasses.replace(serving.LOCAL, **limits))


@pytest.fixture(scope="module")
def vis(tiny):
    return make_vis(tiny)


def tokens_of(outputs: list[dict], vis) -> dict[str, list[int]]:
    return {n: r.tokens for n, r in outputs[-1][vis.tab].record.runs.items()}


# ---------------------------------------------------------------------------------------------- 9: Stop while queued
def test_stop_pressed_while_a_run_waits_in_the_queue_stops_it_before_it_starts(vis, monkeypatch):
    tab = TabState()
    queued_at = time.monotonic()          # the run entered the queue ...
    assert "will not start" in vis.stop(tab)   # ... and Stop was pressed while it waited
    monkeypatch.setattr(vis.handlers, "_queued_at", lambda: queued_at)
    outs = list(vis.run(tab, PROMPT, *VALUES))
    assert len(outs) == 1 and outs[0][vis.status].startswith("**Stopped** before it started"), outs
    assert "waited in the queue" in outs[0][vis.status] and tab.record is None and tab.active == 0
    out = vis.step_once(tab, PROMPT, *VALUES)   # a queued step-once click is cancelled the same way
    assert out[vis.status].startswith("**Stopped** before it started") and tab.step_session is None
    # a request queued after the Stop runs as usual
    monkeypatch.setattr(vis.handlers, "_queued_at", time.monotonic)
    assert list(vis.run(tab, PROMPT, *VALUES))[-1][vis.status].startswith("✓ **Done")
    assert "round 1" in vis.step_once(tab, PROMPT, *VALUES)[vis.status]


def test_stop_while_queued_through_the_server_and_the_queue_position(tiny):
    """A real server: tab A's run holds the engine slot; tab B's run waits (Gradio tells B its place in the
    queue); a third request finds the queue full (queue_max_size 1); B presses Stop; when A is done, B's run
    stops at once and says why."""
    gradio_client = pytest.importorskip("gradio_client")
    from gradio_client.utils import Status
    v = make_vis(tiny, queue_max_size=1)
    gate, entered = threading.Event(), threading.Event()
    checkout = v.factory.checkout

    def held_checkout(settings, **kw):     # the first run waits here, holding the engine slot
        if not gate.is_set():
            entered.set()
            assert gate.wait(120)
        return checkout(settings, **kw)

    v.factory.checkout = held_checkout
    url = launch_local(v.demo)
    v.demo._queue.max_size = v.limits.queue_max_size   # launch_local queues without a size; main() uses queued()
    try:
        a = gradio_client.Client(url, verbose=False, download_files=False)
        b = gradio_client.Client(url, verbose=False, download_files=False)
        c = gradio_client.Client(url, verbose=False, download_files=False)
        job_a = a.submit(PROMPT, *VALUES, api_name="/run")
        assert entered.wait(60)
        job_b = b.submit(PROMPT, *VALUES, api_name="/run")
        deadline = time.monotonic() + 60
        while job_b.status().code != Status.IN_QUEUE and time.monotonic() < deadline:
            time.sleep(0.05)
        st = job_b.status()
        assert st.code == Status.IN_QUEUE and st.rank == 0 and st.queue_size == 1, st   # first in line
        with pytest.raises(Exception, match="(?i)queue is full"):
            c.predict(PROMPT, *VALUES, api_name="/run")
        # Stop as the page sends it: straight to the server, past the queue (queue=False); gradio_client would
        # queue it, and a full queue would refuse it
        import httpx
        r = httpx.post(f"{url}gradio_api/run/stop", json={"data": [None], "session_hash": b.session_hash},
                       timeout=30)
        assert r.status_code == 200 and "will not start" in json.dumps(r.json(), ensure_ascii=False), r.text
        gate.set()
        assert "Done.**" in json.dumps(job_a.result(timeout=120), ensure_ascii=False, default=str)
        text = json.dumps(job_b.result(timeout=120), ensure_ascii=False, default=str)
        assert "Stopped** before it started" in text, text[:500]
        # B's next run (queued after the Stop) runs
        assert "Done.**" in json.dumps(b.predict(PROMPT, *VALUES, api_name="/run"), ensure_ascii=False, default=str)
    finally:
        gate.set()
        v.demo.close()


# ---------------------------------------------------------------------------------------------- 11: limits
def test_serving_limits_are_chosen_by_mode_applied_and_documented(tiny):
    assert serving.serving_limits(env={}) is serving.LOCAL
    for kw in (dict(listen=True), dict(share=True), dict(env={"SPACE_ID": "me/dart"})):
        assert serving.serving_limits(**kw) is serving.HOSTED, kw
    # every limit is one ServingLimits field; README.md's table is generated from them
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert serving.readme_table() in readme, "README.md's serving-limits table is stale: python -m dart_core.ui.serving"
    names = {f.name for f in dataclasses.fields(serving.ServingLimits)} - {"name"}
    assert {n for n, _ in serving.HOSTED.rows()} == names
    # hosted: bounded everywhere a stranger could spend the server's time or memory
    h = serving.HOSTED
    assert h.run_time_limit_s and h.max_new_tokens and h.queue_max_size <= serving.LOCAL.queue_max_size
    # the page's own runs replay: the sliders' largest trees and candidate sets fit the replay limits (and the
    # settings API's largest trees: 1024 nodes + the root)
    target, args = tiny
    c = Visualiser(target, args).controls
    k, d = c.eagle3_top_k.maximum, c.eagle3_depth.maximum
    for lim in (serving.LOCAL, serving.HOSTED):
        assert lim.replay_max_tree_nodes >= max(1025, c.budget.maximum + 1, c.eagle3_total_token.maximum)
        assert lim.replay_max_candidates >= k + d * k * k            # EAGLE-3: k + depth * k * k candidates
    # applied: upload size (launch), file clean-up (Blocks), queue size
    assert launch_kwargs(args)["max_file_size"] == serving.LOCAL.max_upload_bytes
    assert launch_kwargs(app.parse_args(["--listen"]))["max_file_size"] == serving.HOSTED.max_upload_bytes
    # the page's CSS is page-wide (a gr.HTML's css_template is scoped to that one component): the hover and click
    # outlines reach the answers, and the tree plots scroll in a frame
    css = launch_kwargs(args)["css"]
    assert ".token.dart-linked" in css and ".token.dart-selected" in css and ".tree-frame" in css
    v = Visualiser(target, args, limits=serving.HOSTED)
    assert v.demo.delete_cache == (h.file_sweep_s, h.file_ttl_s)
    assert v.queued()._queue.max_size == h.queue_max_size


def test_hosted_max_new_tokens_caps_the_flag_and_the_slider(tiny):
    v = make_vis(tiny, max_new_tokens=16)          # --max-new-tokens 32 on a server that allows 16
    assert v.max_new_tokens == 16 and v.controls.max_new_tokens.maximum == 16
    final = list(v.run(None, PROMPT, 20, *VALUES[1:]))[-1]
    assert final[v.status].startswith("⚠") and "at most 16" in final[v.status]
    assert list(v.run(None, PROMPT, 16, *VALUES[1:]))[-1][v.status].startswith("✓ **Done")


def test_the_time_limit_stops_a_run_and_the_page_names_it(tiny):
    v = make_vis(tiny, run_time_limit_s=1e-9)
    outs = list(v.run(None, PROMPT, *VALUES))
    assert "stop after 1e-09 s" in outs[0][v.status]
    final = outs[-1]
    assert final[v.status].startswith("⏱ **Stopped by the time limit") and "run_time_limit_s" in final[v.status]
    runs = final[v.tab].record.runs.values()
    assert {r.stop_reason for r in runs} == {TIME_LIMIT} and "stopped by the time limit (partial run)" in final[v.metrics["dart"]]
    assert not any(e.busy for e in v.factory.build(RunSettings()).values())   # the engines went back


def test_the_memory_budget_releases_the_least_recently_used_tab_first(tiny):
    v = make_vis(tiny)
    # fixed trees: every run records the same steps, so the tabs' sizes are equal (automatic trees follow this
    # machine's timings, which would make one run's record larger than another's)
    a = list(v.run(None, PROMPT, *FIXED))[-1][v.tab]
    size = a.nbytes()
    assert size > 10_000                       # traces: trees, candidates, probabilities of every step
    v.limits = dataclasses.replace(v.limits, session_memory_bytes=int(2.5 * size))
    b = list(v.run(None, PROMPT, *FIXED))[-1][v.tab]
    v.show_step(a, 3)                          # tab A is used again: B is now the least recently used
    c = list(v.run(None, PROMPT, *FIXED))[-1][v.tab]
    assert b.record is None and "session_memory_bytes" in b.dropped
    assert a.record is not None and c.record is not None
    assert "memory budget" in v.show_step(b, 3)[v.step_text["dart"]]
    # a step-once tab counts its engines' KV caches too, and goes first when it is the oldest
    s = v.step_once(None, PROMPT, *FIXED)[v.tab]
    assert s.step_session.lease.cache_nbytes() > 0 and s.nbytes() > s.record.nbytes()
    list(v.run(a, PROMPT, *FIXED))            # a new run of tab A: C, then the stepped tab are older
    assert c.record is None and s.step_session is None and a.record is not None
    # a run that alone outgrows the budget stops, and says which limit stopped it
    v.limits = dataclasses.replace(v.limits, session_memory_bytes=1)
    final = list(v.run(a, PROMPT, *FIXED))[-1]
    assert final[v.status].startswith("**Stopped by the memory limit") and "session_memory_bytes" in final[v.status]


def test_replay_refuses_steps_over_the_node_limits(vis, tmp_path):
    record = RunRecord.from_export(RECORDED)
    assert vis.limits.replay_problem(record) is None and serving.HOSTED.replay_problem(record) is None
    biggest = max(len(st.tree) for r in record.runs.values() for st in r.traces)
    most = max(len(st.candidates) for r in record.runs.values() for st in r.traces if st.candidates is not None)
    small = dataclasses.replace(serving.LOCAL, replay_max_tree_nodes=biggest - 1)
    assert "replay_max_tree_nodes" in small.replay_problem(record)
    few = dataclasses.replace(serving.LOCAL, replay_max_candidates=most - 1)
    assert "replay_max_candidates" in few.replay_problem(record)
    old = vis.limits
    try:
        vis.limits = small
        out = vis.replay(None, str(RECORDED))
        assert out[vis.status].startswith("⚠ **Cannot replay") and "replay_max_tree_nodes" in out[vis.status]
        assert out[vis.tab].record is None
    finally:
        vis.limits = old
    assert vis.replay(None, str(RECORDED))[vis.status].startswith("**Replaying")


def test_uploads_over_the_size_limit_are_refused_by_the_server(tiny, tmp_path):
    gradio_client = pytest.importorskip("gradio_client")
    v = make_vis(tiny, max_upload_bytes=RECORDED.stat().st_size + 1024)
    url = launch_local(v.demo, max_file_size=v.limits.max_upload_bytes)   # as launch_kwargs() passes it
    try:
        client = gradio_client.Client(url, verbose=False, download_files=False)
        ok = client.predict(gradio_client.handle_file(str(RECORDED)), api_name="/replay")
        assert "Replaying" in json.dumps(ok, ensure_ascii=False, default=str)
        big = tmp_path / "big.json"
        big.write_bytes(RECORDED.read_bytes() + b" " * 4096)   # still a valid export, but too large
        with pytest.raises(Exception, match="exceeds the maximum file size"):   # the page knows the limit ...
            client.predict(gradio_client.handle_file(str(big)), api_name="/replay")
        import httpx                                                        # ... and the server enforces it
        with big.open("rb") as f:
            r = httpx.post(f"{url}gradio_api/upload", files={"files": ("big.json", f)}, timeout=30)
        assert r.status_code == 413 and "exceeded" in r.text, (r.status_code, r.text[:300])
    finally:
        v.demo.close()


def test_a_tab_keeps_only_its_latest_export(vis):
    tab = list(vis.run(None, PROMPT, *VALUES))[-1][vis.tab]
    first = Path(vis.export(tab)[vis.export_file])
    time.sleep(1.1)                             # a new timestamp in the name
    second = Path(vis.export(tab)[vis.export_file])
    assert second.is_file() and not first.exists() and list(second.parent.iterdir()) == [second]
    big = dataclasses.replace(vis.limits, max_upload_bytes=10)
    old, vis.limits = vis.limits, big
    try:
        assert "max_upload_bytes" in vis.export(tab)[vis.status]   # the page warns: it will not replay here
    finally:
        vis.limits = old
    tab.release()
    assert not second.parent.exists()


# ---------------------------------------------------------------------------------------------- 12: engine ownership
def test_interleaved_runs_of_two_tabs_give_the_answers_they_give_alone(vis, monkeypatch):
    alone_a = tokens_of(list(vis.run(None, PROMPT, *VALUES)), vis)
    alone_b = tokens_of(list(vis.run(None, OTHER, *OTHER_VALUES)), vis)
    monkeypatch.setattr(handlers, "UI_INTERVAL_S", 0.0)     # yield after every engine step: the finest interleaving
    gens = {"a": vis.run(TabState(), PROMPT, *VALUES), "b": vis.run(TabState(), OTHER, *OTHER_VALUES)}
    outs: dict[str, list[dict]] = {"a": [], "b": []}
    steps = 0
    while gens:
        for k in list(gens):
            try:
                outs[k].append(next(gens[k]))
                steps += 1
            except StopIteration:
                del gens[k]
    assert steps > 20                                  # they did interleave, step by step
    for k, alone in (("a", alone_a), ("b", alone_b)):
        assert outs[k][-1][vis.status].startswith("✓ **Done"), outs[k][-1][vis.status]
        assert tokens_of(outs[k], vis) == alone, k
    # both runs gave their engines back: the next run reuses them
    assert not any(e.busy for e in vis.factory.build(RunSettings()).values())


def test_an_engine_belongs_to_one_run_at_a_time(vis):
    factory = vis.factory
    settings = RunSettings.from_values(**dict(zip(SETTING_NAMES, VALUES)))
    one = factory.checkout(settings)
    two = factory.checkout(settings)                   # another run meanwhile: engines of its own
    assert all(one.engines[n] is not two.engines[n] for n in factory.names)
    two.release()
    one.release()
    with factory.checkout(settings) as again:          # the pool hands idle engines out again
        assert all(again.engines[n] is one.engines[n] for n in factory.names)
        with factory.checkout(settings) as meanwhile:
            assert meanwhile.engines["vanilla"] is not again.engines["vanilla"]
    # the same engine objects given to two comparisons (bypassing the factory): the second generation is
    # refused before it touches the cache, and the first answer is still right
    target = vis.target
    ids = target.tokenizer.encode(PROMPT)
    cfg = vis.handlers._config(settings)
    ref = SpeculativeEngine(target).generate(ids, cfg).tokens
    engine = SpeculativeEngine(target)
    first = Comparison({"vanilla": engine}, ids, cfg, decode=target.tokenizer)
    second = Comparison({"vanilla": engine}, target.tokenizer.encode(OTHER), cfg, decode=target.tokenizer)
    first.advance()
    assert engine.busy
    second.advance()
    bad = second.record.runs["vanilla"]
    assert bad.done and EngineBusyError.__name__ in bad.error and not bad.tokens
    for _ in first.run():
        pass
    assert first.record.runs["vanilla"].tokens == ref and not engine.busy
    gen = engine.stream(ids, cfg)
    next(gen)
    with pytest.raises(EngineBusyError):
        next(engine.stream(ids, cfg))
    gen.close()                                        # closing the generation frees the engine
    assert not engine.busy and engine.generate(ids, cfg).tokens == ref


def test_a_closed_or_abandoned_run_gives_its_engines_back(vis):
    gen = vis.run(None, PROMPT, 32, *VALUES[1:])
    tab = next(gen)[vis.tab]
    assert tab.active == 1
    gen.close()                                        # the visitor left mid-run (Gradio closes the generator)
    assert tab.active == 0
    settings = RunSettings.from_values(**dict(zip(SETTING_NAMES, (32,) + VALUES[1:])))
    with vis.factory.checkout(settings) as lease:
        assert not any(e.busy for e in lease.engines.values())
