"""Lossless sampling, checked by distribution: the exact distributions of the first answer tokens under direct
sampling from a target, and a chi-square goodness of fit of sampled counts against them. The engine's tests
(tests/engine/test_decoding.py) and the drafters' (tests/drafters/test_context_decoding.py) share them."""
import numpy as np
import torch
from scipy import stats


def exact_marginals(target, prompt, cfg):
    """Exact distributions of answer tokens 1 and 2 (0-based) under direct sampling from the target.

    With top_k set, each warped row has at most top_k nonzero entries, so only those branches are expanded.
    """
    from dart_core.engine.sampling import warp_probs

    def next_probs(seqs):
        with torch.no_grad():
            logits = target.model(input_ids=torch.tensor(seqs)).logits[:, -1]
        return warp_probs(logits, cfg.temperature, cfg.top_k, cfg.top_p).double()

    p0 = next_probs([prompt])[0]
    firsts = torch.nonzero(p0).view(-1).tolist()
    p1_given = next_probs([prompt + [a] for a in firsts])            # [A, V]
    p1 = p0[firsts] @ p1_given
    pairs, weights = [], []
    for i, a in enumerate(firsts):
        for b in torch.nonzero(p1_given[i]).view(-1).tolist():
            pairs.append(prompt + [a, b])
            weights.append(float(p0[a] * p1_given[i, b]))
    p2 = torch.tensor(weights, dtype=torch.float64) @ next_probs(pairs)
    return p1.numpy(), p2.numpy()


def chi_square_p(counts, probs):
    expected = probs / probs.sum() * counts.sum()
    big = expected >= 5  # pool rare cells so the chi-square approximation holds
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    exp = exp * (obs.sum() / exp.sum())  # remove float drift; scipy demands equal totals
    return stats.chisquare(obs, exp).pvalue
