"""EAGLE-3 baseline: the published checkpoint layout (safetensors and pytorch_model.bin), strict loading,
target checks, the head's forward and KV cache against an independent reference, the EAGLE-2 dynamic
tree (sizes, ties, d2t), and greedy speculative decoding identical to vanilla decoding in fp32.

The reference below recomputes everything without a cache: a tree node's hidden state is the head run
causally over the real positions followed by the node's ancestor chain (which is what the tree mask
means), with h = fc(aux) for real rows and h = the previous row's output g for chain rows.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from dart_core.config import GenerationConfig
from dart_core.engine.decoding import SpeculativeEngine
from dart_core.engine.protocol import AcceptedStep
from dart_core.drafters.eagle3 import Eagle3Drafter, Eagle3TreeConfig, topk_stable
from dart_core.models.heads.files import DartHeadError, HeadError, HeadTargetMismatch
from dart_core.models.heads.eagle3 import (Eagle3HeadError, load_eagle3_for_target, load_eagle3_head,
                                          new_eagle3_head_for_target, save_eagle3_head)

# head_dim 12 != H / heads = 8: the AngelSlim case (head_dim comes from q_proj's rows)
H, I, NH, NKV, HD, V, VD = 32, 48, 4, 2, 12, 50, 20
DRAFT_IDS = torch.arange(1, 2 * VD, 2)          # odd target ids: d2t != 0


# ---------------------------------------------------------------------------------------------- synthetic checkpoint
def published_config(**over) -> dict:
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": I, "num_attention_heads": NH, "num_key_value_heads": NKV, "num_hidden_layers": 1,
           "head_dim": 128, "vocab_size": V, "draft_vocab_size": VD, "rms_norm_eps": 1e-6, "rope_theta": 5000.0,
           "max_position_embeddings": 2048, "hidden_act": "silu", "torch_dtype": "float32"}
    cfg.update(over)
    return cfg


def published_state(seed: int = 0, draft_ids=DRAFT_IDS) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *shape, s=0.3: torch.randn(*shape, generator=g) * s  # noqa: E731
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[draft_ids] = True
    return {
        "fc.weight": r(H, 3 * H),
        "midlayer.self_attn.q_proj.weight": r(NH * HD, 2 * H), "midlayer.self_attn.k_proj.weight": r(NKV * HD, 2 * H),
        "midlayer.self_attn.v_proj.weight": r(NKV * HD, 2 * H), "midlayer.self_attn.o_proj.weight": r(H, NH * HD),
        "midlayer.mlp.gate_proj.weight": r(I, H), "midlayer.mlp.up_proj.weight": r(I, H),
        "midlayer.mlp.down_proj.weight": r(H, I),
        "midlayer.hidden_norm.weight": 1 + r(H), "midlayer.input_layernorm.weight": 1 + r(H),
        "midlayer.post_attention_layernorm.weight": 1 + r(H), "norm.weight": 1 + r(H),
        "lm_head.weight": r(len(draft_ids), H, s=1.0), "d2t": draft_ids - torch.arange(len(draft_ids)), "t2d": t2d,
    }


def write_head(path, state, config, fmt: str = "safetensors") -> str:
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in state.items()}
    if fmt == "safetensors":
        from safetensors.torch import save_file
        save_file(state, str(path / "model.safetensors"))
    else:
        torch.save(state, str(path / "pytorch_model.bin"))
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


# ---------------------------------------------------------------------------------------------- reference
def _rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def ref_layer(sd, emb, h, ids, theta=5000.0):
    """The published decoder layer, causal over all rows (positions 0..L-1), eager fp32 -> g [L, H]."""
    L = h.shape[0]
    x = torch.cat([_rms(emb[ids], sd["midlayer.input_layernorm.weight"]),
                   _rms(h, sd["midlayer.hidden_norm.weight"])], -1)
    inv = 1.0 / (theta ** (torch.arange(0, HD, 2).float() / HD))
    fr = torch.arange(L).float()[:, None] * inv[None]
    cos, sin = torch.cat([fr, fr], -1).cos(), torch.cat([fr, fr], -1).sin()

    def rot(t):
        return torch.cat((-t[..., HD // 2:], t[..., : HD // 2]), dim=-1)
    q = (x @ sd["midlayer.self_attn.q_proj.weight"].T).view(L, NH, HD).transpose(0, 1)
    k = (x @ sd["midlayer.self_attn.k_proj.weight"].T).view(L, NKV, HD).transpose(0, 1)
    v = (x @ sd["midlayer.self_attn.v_proj.weight"].T).view(L, NKV, HD).transpose(0, 1)
    q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
    k, v = k.repeat_interleave(NH // NKV, 0), v.repeat_interleave(NH // NKV, 0)
    mask = torch.full((L, L), float("-inf")).triu(1)
    att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(HD) + mask, -1) @ v
    g = h + att.transpose(0, 1).reshape(L, NH * HD) @ sd["midlayer.self_attn.o_proj.weight"].T
    m = _rms(g, sd["midlayer.post_attention_layernorm.weight"])
    return g + (torch.nn.functional.silu(m @ sd["midlayer.mlp.gate_proj.weight"].T)
                * (m @ sd["midlayer.mlp.up_proj.weight"].T)) @ sd["midlayer.mlp.down_proj.weight"].T


def ref_logits(sd, g):
    return _rms(g, sd["norm.weight"]) @ sd["lm_head.weight"].T


def ref_chain(sd, emb, aux, next_ids, chain):
    """g of the last real row and of each chain token: real rows, then chain rows fed back their predecessor's g."""
    h = aux @ sd["fc.weight"].T
    ids = next_ids.clone()
    outs = [ref_layer(sd, emb, h, ids)[-1]]
    for tok in chain:
        h = torch.cat([h, outs[-1][None]])
        ids = torch.cat([ids, torch.tensor([tok])])
        outs.append(ref_layer(sd, emb, h, ids)[-1])
    return outs


def ref_tree(sd, emb, aux, next_ids, tc: Eagle3TreeConfig, draft_ids):
    """The EAGLE-2 dynamic tree written plainly: returns candidates [(token, parent, depth, score)] and kept indices."""
    k = tc.top_k

    def top(g):
        lp = torch.log_softmax(ref_logits(sd, g), -1)
        order = sorted(range(lp.shape[0]), key=lambda j: (-float(lp[j]), j))[:k]
        return [(int(draft_ids[j]), float(lp[j])) for j in order]

    cands = []                                            # (token, parent, depth, score, chain)
    g0 = ref_chain(sd, emb, aux, next_ids, [])[-1]
    for tok, lp in top(g0):
        cands.append((tok, -1, 1, lp, [tok]))
    frontier = list(range(k))
    for i in range(tc.depth):
        level = []
        for f in frontier:
            tok_f, _, d, s, chain = cands[f]
            g = ref_chain(sd, emb, aux, next_ids, chain)[-1]
            for tok, lp in top(g):
                level.append(len(cands))
                cands.append((tok, f, d + 1, s + lp, chain + [tok]))
        frontier = sorted(level, key=lambda c: (-cands[c][3], c))[:k]
    kept = sorted(sorted(range(len(cands)), key=lambda c: (-cands[c][3], cands[c][2], c))[: tc.total_token - 1])
    return [c[:4] for c in cands], kept


# ---------------------------------------------------------------------------------------------- loading
@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_published_layout_loads_and_reproduces_the_reference_forward(tmp_path, fmt):
    sd = published_state()
    gen = torch.Generator().manual_seed(5)   # seeded: the tolerances below are for fp32 rounding only
    extra = {"embed_tokens.weight": torch.randn(V, H, generator=gen),
             "midlayer.self_attn.rotary_emb.inv_freq": torch.ones(HD // 2)}
    head = load_eagle3_head(write_head(tmp_path / "head", {**sd, **extra}, published_config(), fmt))
    assert head.config.head_dim == HD and head.config.rope_theta == 5000.0
    assert torch.equal(head.draft_ids, DRAFT_IDS)
    emb = torch.randn(V, H, generator=gen)
    head.attach_embedding(emb)

    g = torch.Generator().manual_seed(1)
    aux1, ids1 = torch.randn(7, 3 * H, generator=g), torch.randint(0, V, (7,), generator=g)
    aux2, ids2 = torch.randn(3, 3 * H, generator=g), torch.randint(0, V, (3,), generator=g)
    aux, ids = torch.cat([aux1, aux2]), torch.cat([ids1, ids2])
    cache = head.new_cache(capacity=4)                       # small: forces the cache to grow
    g1 = head.step_real(aux1, ids1, cache)
    torch.testing.assert_close(g1, ref_layer(sd, emb, aux1 @ sd["fc.weight"].T, ids1), atol=2e-5, rtol=1e-5)
    g2 = head.step_real(aux2, ids2, cache)
    assert cache.length == 10
    want = ref_chain(sd, emb, aux, ids, [])[-1]
    torch.testing.assert_close(g2[-1], want, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(head.logits(g2[-1:])[0], ref_logits(sd, want), atol=5e-5, rtol=1e-5)

    # Two tree depths: frontier (a, b) at depth 1, then children (c of a, d of b, e of a) at depth 2.
    a, b, c, d, e = 3, 7, 11, 5, 9
    T = cache.length
    gt1 = head.step_tree(g2[-1:].expand(2, -1), torch.tensor([a, b]), T, cache, T, torch.eye(2, dtype=torch.bool))
    allowed2 = torch.tensor([[1, 0, 1, 0, 0], [0, 1, 0, 1, 0], [1, 0, 0, 0, 1]], dtype=torch.bool)
    gt2 = head.step_tree(gt1[[0, 1, 0]], torch.tensor([c, d, e]), T + 1, cache, T + 2, allowed2)
    for got, chain in ((gt1[0], [a]), (gt1[1], [b]), (gt2[0], [a, c]), (gt2[1], [b, d]), (gt2[2], [a, e])):
        torch.testing.assert_close(got, ref_chain(sd, emb, aux, ids, chain)[-1], atol=3e-5, rtol=1e-5)
    assert cache.length == 10, "tree positions must not persist in the head cache"
    # The next real step overwrites the tree slots and matches a forward that never saw the tree.
    aux3, ids3 = torch.randn(2, 3 * H, generator=g), torch.randint(0, V, (2,), generator=g)
    g3 = head.step_real(aux3, ids3, cache)
    want3 = ref_chain(sd, emb, torch.cat([aux, aux3]), torch.cat([ids, ids3]), [])[-1]
    torch.testing.assert_close(g3[-1], want3, atol=3e-5, rtol=1e-5)


def test_save_and_reload_round_trip(tmp_path):
    head = load_eagle3_head(write_head(tmp_path / "in", published_state(), published_config()))
    save_eagle3_head(head, tmp_path / "fp32", dtype=None)
    again = load_eagle3_head(tmp_path / "fp32")
    assert again.state_dict().keys() == head.state_dict().keys()
    for key, t in head.state_dict().items():
        assert torch.equal(t, again.state_dict()[key]), key
    save_eagle3_head(head, tmp_path / "bf16")
    from safetensors import safe_open
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(published_state())
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
    cfg = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert cfg["head_dim"] == HD and cfg["draft_vocab_size"] == VD
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert load_eagle3_head(tmp_path / "bf16").config.head_dim == HD


def _broken(kind):
    sd, cfg = published_state(), published_config()
    if kind == "missing":
        del sd["midlayer.hidden_norm.weight"]
        return sd, cfg, "missing key midlayer.hidden_norm.weight"
    if kind == "unexpected":
        sd["midlayer.mask_rep"] = torch.zeros(2 * H)              # a DART head is not an EAGLE-3 head
        return sd, cfg, "unexpected key midlayer.mask_rep"
    if kind == "misshaped":
        sd["lm_head.weight"] = torch.zeros(VD + 1, H)
        return sd, cfg, "lm_head.weight has shape [21, 32], expected [20, 32]"
    if kind == "kv_heads":
        sd["midlayer.self_attn.k_proj.weight"] = torch.zeros(NH * HD, 2 * H)
        return sd, cfg, "midlayer.self_attn.k_proj.weight has shape [48, 64], expected [24, 64]"
    if kind == "q_rows":
        sd["midlayer.self_attn.q_proj.weight"] = torch.zeros(NH * HD + 1, 2 * H)
        return sd, cfg, "q_proj.weight has 49 rows, not a multiple of num_attention_heads (4)"
    if kind == "no_vocab_map":
        del sd["d2t"], sd["t2d"]
        return sd, cfg, "missing key d2t (d2t/t2d may be absent only when draft_vocab_size equals vocab_size)"
    if kind == "vocab_disagree":
        sd["t2d"] = torch.zeros(V, dtype=torch.bool)
        return sd, cfg, "d2t and t2d disagree"
    if kind == "config_field":
        del cfg["intermediate_size"]
        return sd, cfg, "missing field(s) intermediate_size"
    if kind == "rope_scaling":
        cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
        return sd, cfg, "rope_scaling"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["missing", "unexpected", "misshaped", "kv_heads", "q_rows", "no_vocab_map",
                                  "vocab_disagree", "config_field", "rope_scaling"])
def test_wrong_or_incomplete_checkpoints_fail_naming_the_problem(tmp_path, kind):
    sd, cfg, msg = _broken(kind)
    with pytest.raises(Eagle3HeadError) as err:
        load_eagle3_head(write_head(tmp_path / kind, sd, cfg, "bin" if kind == "missing" else "safetensors"))
    assert msg in str(err.value)
    assert isinstance(err.value, HeadError)              # one error family for both heads,
    assert not isinstance(err.value, DartHeadError)      # each head's errors its own


def test_unreadable_files_and_paths(tmp_path):
    path = write_head(tmp_path / "h", published_state(), published_config())
    (tmp_path / "h" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(Eagle3HeadError, match="not a readable safetensors file"):
        load_eagle3_head(path)
    (tmp_path / "h" / "model.safetensors").unlink()
    with pytest.raises(Eagle3HeadError, match="neither model.safetensors nor pytorch_model.bin"):
        load_eagle3_head(path)
    (tmp_path / "h" / "pytorch_model.bin").write_bytes(b"junk")
    with pytest.raises(Eagle3HeadError, match="not a readable PyTorch state dict"):
        load_eagle3_head(path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(Eagle3HeadError, match="has no config.json"):
        load_eagle3_head(tmp_path / "empty")
    with pytest.raises(Eagle3HeadError, match="neither a local directory nor a Hub id"):
        load_eagle3_head("/no/such/head")


def test_hub_ids_fall_back_to_pytorch_model_bin(tmp_path, monkeypatch):
    """A Hub id: config.json, then model.safetensors, else pytorch_model.bin (hf_hub_download stubbed: offline)."""
    import huggingface_hub
    repo = tmp_path / "repo"
    write_head(repo, published_state(), published_config(), "bin")
    asked = []

    def fake_download(repo_id, filename, **kw):
        asked.append((repo_id, filename))
        if not (repo / filename).is_file():
            raise FileNotFoundError(filename)
        return str(repo / filename)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    head = load_eagle3_head("someone/eagle3-head")
    assert head.config.head_dim == HD and head.source == "someone/eagle3-head"
    assert [f for _, f in asked] == ["config.json", "model.safetensors", "pytorch_model.bin"]
    (repo / "pytorch_model.bin").unlink()
    with pytest.raises(Eagle3HeadError, match="has no EAGLE-3 weights.*pytorch_model.bin: FileNotFoundError"):
        load_eagle3_head("someone/eagle3-head")


def test_full_vocabulary_head_may_omit_the_vocab_map(tmp_path):
    sd = published_state(draft_ids=torch.arange(V))
    del sd["d2t"], sd["t2d"]
    cfg = published_config(draft_vocab_size=V)
    head = load_eagle3_head(write_head(tmp_path / "full", sd, cfg))
    assert torch.equal(head.draft_ids, torch.arange(V)) and bool(head.t2d.all())
    del cfg["draft_vocab_size"]                          # absent = the full vocabulary
    assert load_eagle3_head(write_head(tmp_path / "full2", sd, cfg)).config.draft_vocab_size == V


# ---------------------------------------------------------------------------------------------- the drafter, unit level
def _drafter_on_synthetic_head(tmp_path, tc):
    sd = published_state(seed=4)
    head = load_eagle3_head(write_head(tmp_path / "h", sd, published_config()))
    emb = torch.randn(V, H, generator=torch.Generator().manual_seed(2))
    head.attach_embedding(emb)
    return sd, emb, head, Eagle3Drafter(head, tc)


def test_dynamic_tree_matches_the_plain_reference_and_applies_d2t(tmp_path):
    tc = Eagle3TreeConfig(total_token=12, depth=3, top_k=3)
    sd, emb, head, drafter = _drafter_on_synthetic_head(tmp_path, tc)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, V, (6,), generator=g).tolist()
    aux = torch.randn(6, 3 * H, generator=g)
    root = 17
    drafter.begin(prompt, aux)
    prop = drafter.propose(prompt + [root])
    cands, kept = ref_tree(sd, emb, aux, torch.tensor(prompt[1:] + [root]), tc, DRAFT_IDS.tolist())

    c = prop.candidates
    assert len(c) == 3 + 3 * 9 == len(cands)
    assert list(c.token) == [x[0] for x in cands], "tokens (after the d2t mapping) differ from the reference"
    assert set(c.token) <= set(DRAFT_IDS.tolist())
    assert list(c.parent) == [x[1] for x in cands] and list(c.depth) == [x[2] for x in cands]
    torch.testing.assert_close(torch.tensor(list(c.score)), torch.tensor([x[3] for x in cands], dtype=torch.float64),
                               atol=1e-4, rtol=0)
    assert [i for i, k in enumerate(c.kept) if k] == kept
    tree = prop.tree
    assert len(tree) == tc.total_token and int(tree.tokens[0]) == root
    for i in range(1, len(tree)):                       # tree nodes are the kept candidates, in candidate order
        cand = kept[i - 1]
        assert c.node[cand] == i and tree.tokens[i] == c.token[cand] and tree.depths[i] == c.depth[cand]
        p = c.parent[cand]
        assert tree.parents[i] == (0 if p < 0 else c.node[p])
    assert prop.draft_forward_s > 0 and prop.tree_build_s > 0


@pytest.mark.parametrize("total,depth,k", [(60, 7, 10), (10, 2, 4), (200, 3, 3), (5, 0, 8), (1, 2, 2)])
def test_tree_respects_total_token_depth_and_top_k(tmp_path, total, depth, k):
    tc = Eagle3TreeConfig(total_token=total, depth=depth, top_k=k)
    _, _, _, drafter = _drafter_on_synthetic_head(tmp_path, tc)
    prompt = [4, 8, 15, 16, 23]
    drafter.begin(prompt, torch.randn(5, 3 * H))
    prop = drafter.propose(prompt + [42])
    n_cands = k + depth * k * k
    assert len(prop.candidates) == n_cands
    assert len(prop.tree) == min(total, 1 + n_cands) <= drafter.max_tree_nodes
    assert prop.tree.max_depth <= depth + 1
    assert max(len(ch) for ch in prop.tree.children()) <= k
    assert max(prop.candidates.depth) == depth + 1
    for d in range(2, depth + 2):                        # only k nodes per depth are expanded
        assert len({p for p, dd in zip(prop.candidates.parent, prop.candidates.depth) if dd == d}) <= k
    # Kept = the best scores: nothing dropped outranks anything kept.
    c = prop.candidates
    kept_scores = [s for s, kk in zip(c.score, c.kept) if kk]
    dropped = [s for s, kk in zip(c.score, c.kept) if not kk]
    if kept_scores and dropped:
        assert min(kept_scores) >= max(dropped)


def test_ties_are_broken_deterministically(tmp_path):
    """A head whose logits all tie: every choice falls to the lowest draft id / earliest candidate."""
    tc = Eagle3TreeConfig(total_token=9, depth=2, top_k=3)
    _, _, head, drafter = _drafter_on_synthetic_head(tmp_path, tc)
    with torch.no_grad():
        head.lm_head.weight.zero_()
    prompt = [1, 2, 3]
    trees = []
    for _ in range(2):
        drafter.begin(prompt, torch.randn(3, 3 * H))
        trees.append(drafter.propose(prompt + [5]))
    a, b = trees
    assert a.tree.to_dict() == b.tree.to_dict() and list(a.candidates.kept) == list(b.candidates.kept)
    ids = DRAFT_IDS.tolist()
    # depth 1: draft ids 0, 1, 2; then depth 2: the first frontier node's children, then the second's
    assert a.tree.tokens.tolist() == [5] + ids[:3] + ids[:3] + ids[:2]
    assert a.tree.parents.tolist() == [-1, 0, 0, 0, 1, 1, 1, 2, 2]
    # frontier at depth 2 = the first three children of node 1 (candidates 3, 4, 5), so depth 3 hangs off them
    assert {p for p, d in zip(a.candidates.parent, a.candidates.depth) if d == 3} == {3, 4, 5}


def test_topk_stable_breaks_ties_to_the_lower_index():
    x = torch.tensor([[0.0, 1.0, 1.0, 1.0, -1.0], [3.0, 2.0, 1.0, 0.0, -1.0]])
    vals, idx = topk_stable(x, 2)
    assert idx.tolist() == [[1, 2], [0, 1]] and vals.tolist() == [[1.0, 1.0], [3.0, 2.0]]


def test_tree_config_errors_name_the_field():
    with pytest.raises(ValueError, match="Eagle3TreeConfig.top_k=0"):
        Eagle3TreeConfig(top_k=0)
    with pytest.raises(ValueError, match="Eagle3TreeConfig.total_token"):
        Eagle3TreeConfig(total_token=0)


# --------------------------------------------------------------- real (tiny) targets: the tiny fixture in conftest.py
@pytest.fixture(scope="module")
def tiny_head_dir(tiny, tmp_path_factory):
    _, targets = tiny
    t = targets["llama"]
    head = new_eagle3_head_for_target(t, draft_ids=torch.arange(0, t.vocab_size, 2), seed=3)
    return save_eagle3_head(head, tmp_path_factory.mktemp("head") / "llama-eagle3", dtype=None)


def test_a_head_for_another_target_is_refused(tiny, tiny_head_dir, tmp_path):
    _, targets = tiny
    head = load_eagle3_head(tiny_head_dir, targets["llama"])
    assert head.embedding is targets["llama"].model.get_input_embeddings().weight
    with pytest.raises(HeadTargetMismatch, match="other weights .*fingerprint.*dart_core.train eagle3") as err:
        load_eagle3_head(tiny_head_dir, targets["llama_other"])
    assert isinstance(err.value, Eagle3HeadError) and not isinstance(err.value, DartHeadError)
    with pytest.raises(HeadTargetMismatch, match="qwen3"):
        load_eagle3_head(tiny_head_dir, targets["qwen3"])
    cfg = json.loads((tiny_head_dir / "config.json").read_text())
    assert cfg["eagle3_target"]["model_type"] == "llama" and len(cfg["eagle3_target"]["fingerprint"]) == 64
    # A published head (no target record) is checked by shape: H=32 cannot read a 64-wide target.
    pub = write_head(tmp_path / "pub", published_state(), published_config())
    with pytest.raises(HeadTargetMismatch, match="hidden size"):
        load_eagle3_head(pub, targets["llama"])


PROMPTS = ["Write a Python function that returns the sum", "The quick brown fox", "What is 12 times 7?"]


@pytest.mark.parametrize("model", ["llama", "qwen3"])
def test_greedy_output_identical_to_vanilla_fp32(tiny, model):
    _, targets = tiny
    t = targets[model]
    head = new_eagle3_head_for_target(t, draft_ids=torch.arange(1, t.vocab_size, 3), seed=5)
    tc = Eagle3TreeConfig(total_token=20, depth=4, top_k=4)
    eagle, vanilla = SpeculativeEngine(t, Eagle3Drafter(head, tc)), SpeculativeEngine(t)
    cfg = GenerationConfig(max_new_tokens=40, max_length=120)
    for p in PROMPTS:
        ids = t.tokenizer.encode(p, add_special_tokens=False)
        a, b = eagle.generate(ids, cfg), vanilla.generate(ids, cfg)
        assert a.tokens == b.tokens, f"EAGLE-3 greedy output differs from vanilla for {p!r}"
        assert a.stats.tau >= 1.0
        for tr in a.traces:
            assert tr.candidates is not None and len(tr.tree) <= tc.total_token
            assert tr.tree.max_depth <= tc.depth + 1
        tr = a.traces[0]
        assert sum(tr.candidates.kept) == len(tr.tree) - 1
        assert tr.timings["draft_forward"] > 0 and tr.timings["tree_build"] > 0


def test_an_oracle_head_is_accepted_through_the_d2t_mapping(tiny):
    """A head that always puts the target's next greedy token first (in a partial draft vocabulary, so
    through d2t) gets a full-depth path accepted: the tree, positions and verification agree."""
    _, targets = tiny
    t = targets["llama"]
    cfg = GenerationConfig(max_new_tokens=30, max_length=120)
    ids = t.tokenizer.encode(PROMPTS[0], add_special_tokens=False)
    truth = SpeculativeEngine(t).generate(ids, cfg).tokens
    full = ids + truth
    draft_ids = torch.tensor(sorted(set(truth) | {1, 2, 3}))
    head = new_eagle3_head_for_target(t, draft_ids=draft_ids, seed=0)
    to_draft = head.target_to_draft()
    tc = Eagle3TreeConfig(total_token=12, depth=3, top_k=2)
    drafter = Eagle3Drafter(head, tc, head_backend="torch")   # its head methods are patched below
    # Replace the head's forwards with an oracle: g carries the position whose next token is predicted.

    def step_real(aux, next_ids, cache):
        cache.length += int(next_ids.shape[0])
        # the last real row predicts the token after the root, full[cache.length + 1]
        return torch.full((int(next_ids.shape[0]), t.hidden_size), float(cache.length + 1))

    def step_tree(h, tok, position, cache, tree_start, allowed):
        return h + 1.0                                   # a child predicts one position further

    def logits(g):
        out = torch.zeros(g.shape[0], head.config.draft_vocab_size)
        for r in range(g.shape[0]):
            pos = int(g[r, 0])
            if pos < len(full):
                out[r, to_draft[full[pos]]] = 20.0
        return out
    head.step_real, head.step_tree, head.logits = step_real, step_tree, logits
    res = SpeculativeEngine(t, drafter).generate(ids, cfg)
    assert res.tokens == truth
    full_steps = [tr for tr in res.traces if tr.stop_reason is None]
    assert full_steps and all(tr.acceptance_length == tc.depth + 2 for tr in full_steps)


def test_sampling_runs_and_is_reproducible(tiny):
    _, targets = tiny
    t = targets["llama"]
    eng = SpeculativeEngine(t, Eagle3Drafter(new_eagle3_head_for_target(t, seed=1),
                                             Eagle3TreeConfig(total_token=16, depth=3, top_k=4)))
    cfg = GenerationConfig(max_new_tokens=24, max_length=100, temperature=0.8, top_p=0.9, seed=7)
    ids = t.tokenizer.encode(PROMPTS[1], add_special_tokens=False)
    assert eng.generate(ids, cfg).tokens == eng.generate(ids, cfg).tokens


def test_drafter_refuses_out_of_step_use(tiny):
    _, targets = tiny
    t = targets["llama"]
    d = Eagle3Drafter(new_eagle3_head_for_target(t), Eagle3TreeConfig(total_token=8, depth=2, top_k=2))
    ids = [5, 6, 7]
    d.begin(ids, torch.zeros(3, 3 * t.hidden_size))
    with pytest.raises(RuntimeError, match="out of step"):
        d.propose(ids)
    d.begin(ids, torch.zeros(3, 3 * t.hidden_size))
    d.propose(ids + [8])
    with pytest.raises(RuntimeError, match="twice without observe"):
        d.propose(ids + [8])
    d.observe(AcceptedStep([8], 9, torch.zeros(1, 3 * t.hidden_size)))
    assert len(d.propose(ids + [8, 9]).tree) == 8
    with pytest.raises(ValueError, match="needs the target's aux features"):
        d.begin(ids, None)


# ---------------------------------------------------------------------------------------------- bench
def test_bench_method_registration(tiny, tiny_head_dir, tmp_path, monkeypatch):
    import argparse

    from dart_core.bench import runners as bench
    from dart_core.bench.methods import register_all
    from dart_core.models.heads import eagle3 as eagle3_head

    registry: dict = {}

    def reg(spec):
        registry[spec.name] = spec
        return spec
    register_all(reg, bench.MethodSpec, bench.EngineRunner, registry)
    assert "eagle3" in registry and "eagle3" in bench.METHODS
    p = argparse.ArgumentParser()
    registry["eagle3"].add_arguments(p)
    dirs, targets = tiny
    t = targets["llama"]
    args = p.parse_args(["--eagle3-model-name-or-path", str(tiny_head_dir), "--eagle3-total-token", "16",
                         "--eagle3-depth", "3", "--eagle3-top-k", "4"])
    args.base_model_name_or_path = str(dirs["llama"])
    runner = registry["eagle3"].factory(t, args)
    assert runner.engine.drafter.max_tree_nodes == 16
    ids = t.tokenizer.encode(PROMPTS[2], add_special_tokens=False)
    cfg = GenerationConfig(max_new_tokens=20, max_length=100)
    assert runner.run(ids, cfg).tokens == SpeculativeEngine(t).generate(ids, cfg).tokens

    # Unset tree flags take the published default (no per-target constants); set ones win.
    args = p.parse_args(["--eagle3-model-name-or-path", str(tiny_head_dir), "--eagle3-depth", "4"])
    args.base_model_name_or_path = str(dirs["llama"])
    drafter = registry["eagle3"].factory(t, args).engine.drafter
    tc = getattr(drafter, "inner", drafter).tree_settings()
    assert (tc["total_token"], tc["depth"], tc["top_k"]) == (60, 4, 10)

    # No head given: the bundled target's shipped head refuses a target it was not trained for; a
    # checkout without it says how to get one; another target has no default.
    args = p.parse_args([])
    args.base_model_name_or_path = None
    if (eagle3_head.bundled_eagle3_head_dir() / "config.json").is_file():
        with pytest.raises(HeadTargetMismatch, match="hidden size 576 .* has hidden size 64"):
            registry["eagle3"].factory(t, args)
    monkeypatch.setattr(eagle3_head, "bundled_eagle3_head_dir", lambda: tmp_path / "none")
    with pytest.raises(Eagle3HeadError, match="no EAGLE-3 head ships .*--eagle3-model-name-or-path"):
        registry["eagle3"].factory(t, args)
    with pytest.raises(Eagle3HeadError, match="no default EAGLE-3 head for"):
        load_eagle3_for_target(t, str(dirs["llama"]), None)
    with pytest.raises(SystemExit):   # the flag's range (dart_core.presets) refuses 0 at parse time
        p.parse_args(["--eagle3-top-k", "0"])
    args = p.parse_args([])
    args.eagle3_top_k = 0             # set past the parser: the factory still names the flag
    with pytest.raises(SystemExit, match="--eagle3-top-k"):
        registry["eagle3"].factory(t, args)
