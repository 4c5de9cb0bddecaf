"""EAGLE-3 training with the training-time test (docs/ARCHITECTURE.md section 7), on the DART trainer's data,
draft vocabulary, features, schedule and run loop (``runner.run_training``).

Per sequence x_0..x_{T-1} (prompt of P tokens + the target's own answer), n = T-1 rows; row a
pairs the target's aux features of position a with the token x_{a+1}. The head is unrolled K
steps (``--ttt-steps``, 7 as published), exactly as the drafter runs it along one chain:

- step 0, row a: h = fc(aux_a), token x_{a+1}, RoPE position a, attends causally to rows <= a
  (the real positions the drafter has in its cache); its g predicts x_{a+2};
- step k > 0, row a (the k-th node of the chain drafted after real position a): h = the row's
  g of step k-1 (the parent's output, fed back), token x_{a+k+1} (the data token: teacher
  forcing), RoPE position a+k; it attends to the step-0 keys of rows <= a and to its own chain,
  the step-1..k keys of the same row a. Its g predicts x_{a+k+2}.

Each step is one call of the head's own layer (``Eagle3Head.layer``) over the concatenated keys
of all steps so far, with an explicit boolean mask (SDPA). The loss of step k is the soft
cross-entropy to the target's distribution at position a+k+1 renormalised over the draft
vocabulary, weighted gamma**k (0.8 as published); rows whose target argmax lies outside the draft
vocabulary, inside the prompt or past the end are masked. Step k has the same meaning as DART's
future position t+k+1, so the held-out hit@1 / hit@10 tables of the two heads line up.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Sequence

import torch

from ..models.heads.eagle3 import Eagle3Head, load_eagle3_head, new_eagle3_head_for_target, save_eagle3_head
from .data import DistillRow
from .features import SequenceFeatures, compute_features
from .model_card import write_model_card  # noqa: F401  (the name this module always had)
from .method import Runtime, TrainMethod
from .run_config import BaseTrainConfig, TrainError  # noqa: F401
from .runner import train
from .stats import LevelStats, level_stats_from_top  # noqa: F401

logger = logging.getLogger(__name__)


@dataclass
class Eagle3TrainConfig(BaseTrainConfig):
    """Every knob of an EAGLE-3 training run (the CLI flags, one to one); the shared ones are
    :class:`~dart_core.training.runner.BaseTrainConfig`'s.

    ttt_steps  unrolled training-time-test steps K (step k is weighted gamma**k)
    """
    gamma: float = 0.8
    ttt_steps: int = 7

    def validate(self) -> None:
        super().validate()
        if self.ttt_steps < 1:
            raise self.bad("ttt_steps", "must be >= 1", self.ttt_steps)


# ---------------------------------------------------------------------------------------------- the unrolled forward
@dataclass
class UnrolledStep:
    """Step k of the unrolled forward: rows ``first``..``first + g.shape[0] - 1`` (anchors a)."""
    k: int
    first: int
    g: torch.Tensor            # [m, H] the head's output (pre-norm) for each row


def unrolled_forward(head: Eagle3Head, aux: torch.Tensor, next_ids: torch.Tensor, steps: int,
                     first_anchor: int = 0) -> list[UnrolledStep]:
    """The training-time-test forward (module docstring) over n rows.

    aux [n, 3H_t] target features of positions 0..n-1; next_ids [n] the token after each
    (x_1..x_n). Step 0 covers every row; step k > 0 the rows a in [first_anchor, n-k) (a chain
    needs its input token x_{a+k+1}). Rows before ``first_anchor`` only serve as step-0 keys (the
    trainer skips chains that cannot reach the answer). Returns one UnrolledStep per step that has rows.
    """
    n = int(next_ids.shape[0])
    if aux.shape[0] != n or n < 1:
        raise ValueError(f"unrolled_forward() needs n >= 1 feature rows with one next token each, got aux "
                         f"{tuple(aux.shape)} and next_ids {tuple(next_ids.shape)}")
    w = head.fc.weight
    dev = w.device
    c = head.config
    kv_dtype = (torch.get_autocast_dtype(dev.type) if torch.is_autocast_enabled(dev.type) else w.dtype)
    ids = next_ids.to(dev)
    rows = torch.arange(n, device=dev)

    # Step 0: the real rows, causal (what the drafter's step_real computes).
    cache = SimpleNamespace(k=torch.zeros(c.num_key_value_heads, n, c.head_dim, dtype=kv_dtype, device=dev),
                            v=torch.zeros(c.num_key_value_heads, n, c.head_dim, dtype=kv_dtype, device=dev))
    h = head.fc(aux.to(dev, w.dtype))
    g = head.layer(h, ids, rows, rows[None, :] <= rows[:, None], cache, write_at=0)
    out = [UnrolledStep(0, 0, g)]
    keys, values = cache.k, cache.v                                  # [kv, L, hd]: step 0, then steps 1..k
    lo = max(0, int(first_anchor))
    for k in range(1, steps):
        m = n - k - lo
        if m <= 0:
            break
        anchors = torch.arange(lo, lo + m, device=dev)
        prev = out[-1]
        h = prev.g[lo - prev.first: lo - prev.first + m]              # the parent's g, fed back
        L = keys.shape[1]
        cache = SimpleNamespace(k=torch.cat([keys, keys.new_zeros(keys.shape[0], m, keys.shape[2])], 1),
                                v=torch.cat([values, values.new_zeros(values.shape[0], m, values.shape[2])], 1))
        # Keys: [step 0 (n rows) | step 1 (m_1 rows) | ... | step k (m rows)]; step j's rows start at anchor lo.
        allowed = torch.zeros(m, L + m, dtype=torch.bool, device=dev)
        allowed[:, :n] = rows[None, :] <= anchors[:, None]           # real positions <= a
        start = n
        for j in range(1, k + 1):                                    # the chain: steps 1..k of the same anchor
            allowed[torch.arange(m, device=dev), start + (anchors - lo)] = True
            start += n - j - lo
        g = head.layer(h, ids[anchors + k], anchors + k, allowed, cache, write_at=L)
        keys, values = cache.k, cache.v
        out.append(UnrolledStep(k, lo, g))
    return out


# ---------------------------------------------------------------------------------------------- the loss
def eagle3_loss(head: Eagle3Head, feats: SequenceFeatures, steps: int, gamma: float, t2d_index: torch.Tensor,
                autocast: bool = False, with_stats: bool = True) -> tuple[torch.Tensor, LevelStats | None] | None:
    """Weighted soft cross-entropy of one sequence over every answer position and unrolled step.

    t2d_index [V]: draft id of each target id, -1 outside the draft vocabulary. The loss is
    sum(w*valid*ce) / sum(w*valid) with w = gamma**k. Stats: per step, over anchors a whose step 0
    predicts an answer token (P-1 <= a <= T-3), like DART's prefixes. None when the sequence has
    no answer position to learn.
    """
    dev = head.fc.weight.device
    P, T = feats.prompt_len, feats.length
    n = T - 1
    R = feats.logits.shape[0]                     # rows for positions P..T-2
    if R <= 0:
        return None
    aux = feats.aux[:n].to(head.fc.weight.dtype)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
        unrolled = unrolled_forward(head, aux, feats.ids[1:], steps, first_anchor=max(0, P - steps))
    target_p = torch.softmax(feats.logits.to(dev), dim=-1)                      # [R, V_d]
    labels_all = t2d_index[feats.argmax.to(dev)]                                # [R] draft ids (-1 outside)
    lo_a, hi_a = P - 1, T - 2                                                   # stats anchors [lo_a, hi_a)
    A = max(0, hi_a - lo_a)
    K = steps
    num = torch.zeros((), device=dev)
    den = torch.zeros((), device=dev)
    topn = min(10, head.config.draft_vocab_size)
    st_top = torch.full((A, K, topn), -2, dtype=torch.long, device=dev)
    st_labels = torch.full((A, K), -1, dtype=torch.long, device=dev)
    st_inrange = torch.zeros(A, K, dtype=torch.bool, device=dev)
    st_ce = torch.zeros(A, K, device=dev)
    for u in unrolled:
        m = u.g.shape[0]
        anchors = torch.arange(u.first, u.first + m, device=dev)
        r = anchors + u.k + 1 - P                                               # row into feats.logits
        in_range = (r >= 0) & (r < R)
        if not bool(in_range.any()):
            continue
        sel = in_range.nonzero().view(-1)
        rr = r[sel]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            logits = head.logits(u.g[sel])                                      # [s, V_d] float32
        logp = torch.log_softmax(logits.float(), dim=-1)
        ce = -(target_p[rr] * logp).sum(-1)                                     # [s]
        labels = labels_all[rr]
        valid = labels >= 0
        wk = float(gamma) ** u.k
        num = num + wk * (ce * valid).sum()
        den = den + wk * valid.sum()
        if with_stats:
            a = anchors[sel]
            keep = (a >= lo_a) & (a < hi_a)
            ai = a[keep] - lo_a
            st_top[ai, u.k] = logits.detach()[keep].topk(topn, dim=-1).indices
            st_labels[ai, u.k] = labels[keep]
            st_inrange[ai, u.k] = True
            st_ce[ai, u.k] = ce.detach()[keep]
    loss = num / den.clamp(min=1e-8)
    stats = None
    if with_stats:
        stats = level_stats_from_top(st_top, st_labels, st_inrange & (st_labels >= 0), st_inrange, st_ce)
    return loss, stats


# ---------------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate_eagle3_head(head: Eagle3Head, target, rows: Sequence[DistillRow], *, steps: int = 7, gamma: float = 0.8,
                         argmax_mode: str = "full", autocast: bool = False, progress: bool = False,
                         features: Callable | None = None) -> dict:
    """hit@1 / hit@10 / cross-entropy per unrolled step on ``rows`` (held-out), every answer position;
    step k is labelled t+(k+1), the future position DART's tables use. ``features(row, draft_ids)``
    supplies the target features (default: the target run on the fly)."""
    from tqdm.auto import tqdm

    was_training = head.training
    head.eval()
    t2d_index = head.target_to_draft()
    total = LevelStats.zeros(steps)
    losses, weights = 0.0, 0.0
    for row in tqdm(rows, desc="eval", unit="row", disable=not progress, file=sys.stderr, dynamic_ncols=True):
        feats = (features(row, head.draft_ids) if features is not None else
                 compute_features(target, row.ids, len(row.prompt_ids), head.draft_ids, argmax_mode))
        res = eagle3_loss(head, feats, steps, gamma, t2d_index, autocast=autocast)
        if res is None:
            continue
        loss, st = res
        total.add(st)
        n = float(st.count.sum())
        losses += float(loss) * n
        weights += n
    head.train(was_training)
    out = total.summary()
    out.update(rows=len(rows), loss=round(losses / max(weights, 1.0), 4), anchors_per_row="all",
               steps=steps, positions=[f"t+{i + 1}" for i in range(steps)])
    return out


# ---------------------------------------------------------------------------------------------- the run
class Eagle3Method(TrainMethod):
    name = "eagle3"
    bar_desc = "train eagle3"
    cfg: Eagle3TrainConfig

    @property
    def levels(self) -> int:
        return self.cfg.ttt_steps

    def resolve(self, device: torch.device) -> dict:
        return {"attention": "sdpa", "ttt_steps": self.cfg.ttt_steps}

    def new_head(self, target, draft_ids: torch.Tensor) -> Eagle3Head:
        return new_eagle3_head_for_target(target, draft_ids, seed=self.cfg.seed,
                                          init_lm_head_from_target=self.cfg.init_lm_head_from_target,
                                          init_layer_from_target=self.cfg.init_layer_from_target)

    def read_head(self, path_or_id: str | Path) -> Eagle3Head:
        return load_eagle3_head(path_or_id)

    def save_head(self, head: Eagle3Head, out: Path, dtype: torch.dtype | None) -> None:
        save_eagle3_head(head, out, dtype=dtype)

    def sequence_loss(self, head: Eagle3Head, feats: SequenceFeatures, t2d_index: torch.Tensor, rt: Runtime,
                      generator: torch.Generator):
        return eagle3_loss(head, feats, self.cfg.ttt_steps, self.cfg.gamma, t2d_index, autocast=rt.autocast)

    def evaluate(self, head: Eagle3Head, target, rows: Sequence[DistillRow], rt: Runtime) -> dict:
        cfg = self.cfg
        return evaluate_eagle3_head(head, target, rows, steps=cfg.ttt_steps, gamma=cfg.gamma, argmax_mode=rt.argmax,
                                    autocast=rt.autocast, progress=cfg.progress, features=rt.features)


Eagle3TrainConfig.method = Eagle3Method
#: Run (or resume) an EAGLE-3 training run (``runner.train``: the config's class picks the method).
train_eagle3 = train
