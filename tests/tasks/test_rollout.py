"""The PPO arithmetic against computations written out here: GAE and returns by hand
(an episode ending mid-rollout, a truncated one bootstrapped), the loss by CleanRL's
formulas one sample at a time."""
from __future__ import annotations

import math

import pytest
import torch

from amptrain.tasks.rollout import (LossSettings, Rollout, distribution, explained_variance,
                                    gae, log_prob_entropy, ppo_loss)


def test_gae_and_returns_by_hand_with_an_episode_end_in_the_middle():
    gamma, lam = 0.9, 0.8
    rewards = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    values = torch.tensor([[0.5], [1.0], [1.5], [2.0]])
    ended = torch.tensor([[0.0], [1.0], [0.0], [0.0]])   # the episode ends at t = 1
    advantages, returns = gae(rewards, values, ended, torch.tensor([3.0]), gamma, lam)
    # t=3: 4 + .9*3 - 2 = 4.7;  t=2: 3 + .9*2 - 1.5 = 3.3, + .72*4.7 = 6.684
    # t=1 (ended): 2 - 1 = 1.0, nothing after;  t=0: 1 + .9*1 - .5 = 1.4, + .72*1 = 2.12
    assert advantages.flatten().tolist() == pytest.approx([2.12, 1.0, 6.684, 4.7])
    assert returns.flatten().tolist() == pytest.approx([2.62, 2.0, 8.184, 6.7])


def test_a_truncated_episode_is_bootstrapped_through_its_reward():
    # Truncated at t = 0 with V(final obs) = 10: the rollout adds gamma * 10 to the reward,
    # so the advantage is r + gamma * V(final) - V(s_0), not r - V(s_0).
    gamma = 0.5
    rewards = torch.tensor([[1.0 + gamma * 10.0], [1.0]])
    values = torch.tensor([[2.0], [3.0]])
    ended = torch.tensor([[1.0], [0.0]])
    advantages, _ = gae(rewards, values, ended, torch.tensor([4.0]), gamma, 1.0)
    assert advantages.flatten().tolist() == pytest.approx([1 + 5 - 2, 1 + 0.5 * 4 - 3])


def test_gae_of_two_environments_is_two_independent_computations():
    torch.manual_seed(0)
    rewards, values = torch.randn(6, 2), torch.randn(6, 2)
    ended = torch.tensor([[0, 1], [0, 0], [1, 0], [0, 0], [0, 1], [0, 0]], dtype=torch.float32)
    nxt = torch.randn(2)
    both, _ = gae(rewards, values, ended, nxt, 0.99, 0.95)
    for env in range(2):
        one, _ = gae(rewards[:, env:env + 1], values[:, env:env + 1],
                     ended[:, env:env + 1], nxt[env:env + 1], 0.99, 0.95)
        assert torch.equal(one.flatten(), both[:, env])


def _reference_loss(new_logp, entropy, new_value, old_logp, adv, old_value, returns, s):
    """CleanRL's ppo.py loss, sample by sample in Python floats."""
    n = len(adv)
    mean = sum(adv) / n
    std = math.sqrt(sum((a - mean) ** 2 for a in adv) / (n - 1))
    adv = [(a - mean) / (std + 1e-8) for a in adv]
    pg, vl, kl, clipped = 0.0, 0.0, 0.0, 0
    for i in range(n):
        ratio = math.exp(new_logp[i] - old_logp[i])
        pg += max(-adv[i] * ratio, -adv[i] * min(max(ratio, 1 - s.clip_coef), 1 + s.clip_coef))
        v_clip = old_value[i] + min(max(new_value[i] - old_value[i], -s.clip_coef), s.clip_coef)
        vl += max((new_value[i] - returns[i]) ** 2, (v_clip - returns[i]) ** 2)
        kl += (ratio - 1) - (new_logp[i] - old_logp[i])
        clipped += abs(ratio - 1) > s.clip_coef
    pg, vl = pg / n, 0.5 * vl / n
    ent = sum(entropy) / n
    return pg - s.ent_coef * ent + s.vf_coef * vl, pg, vl, kl / n, clipped / n


def test_ppo_loss_matches_the_reference_computation():
    torch.manual_seed(1)
    n = 16
    new_logp, old_logp = torch.randn(n) * 0.3 - 1, torch.randn(n) * 0.3 - 1
    entropy, adv = torch.rand(n), torch.randn(n)
    new_value, old_value, returns = torch.randn(n), torch.randn(n), torch.randn(n)
    settings = LossSettings(clip_coef=0.2, ent_coef=0.01, vf_coef=0.5)
    loss, stats = ppo_loss(new_logp, entropy, new_value, old_logp=old_logp, advantages=adv,
                           old_value=old_value, returns=returns, settings=settings)
    ref, pg, vl, kl, frac = _reference_loss(*(t.double().tolist() for t in (
        new_logp, entropy, new_value, old_logp, adv, old_value, returns)), settings)
    assert loss.item() == pytest.approx(ref, rel=1e-5)
    assert stats["policy_loss"].item() == pytest.approx(pg, rel=1e-5, abs=1e-6)
    assert stats["value_loss"].item() == pytest.approx(vl, rel=1e-5)
    assert stats["approx_kl"].item() == pytest.approx(kl, rel=1e-4, abs=1e-7)
    assert stats["clip_frac"].item() == pytest.approx(frac)
    assert 0 < frac < 1  # the case exercises both sides of the clip


def test_log_probabilities_are_fp32_from_half_outputs():
    logits = torch.randn(4, 3).to(torch.bfloat16)
    dist = distribution(logits, None)
    logp, entropy = log_prob_entropy(dist, torch.tensor([0, 1, 2, 0]))
    assert logp.dtype == torch.float32 and entropy.shape == (4,)
    expected = torch.log_softmax(logits.float(), -1)[torch.arange(4), torch.tensor([0, 1, 2, 0])]
    assert torch.allclose(logp, expected)
    mean = torch.zeros(4, 2, dtype=torch.float16)
    gauss = distribution(mean, torch.zeros(2, dtype=torch.float16))
    logp, entropy = log_prob_entropy(gauss, torch.zeros(4, 2))
    assert logp.dtype == torch.float32
    assert logp[0].item() == pytest.approx(2 * -0.5 * math.log(2 * math.pi))
    assert entropy[0].item() == pytest.approx(2 * (0.5 + 0.5 * math.log(2 * math.pi)))


def test_explained_variance_and_the_rollout_minibatch():
    returns = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(returns, returns).item() == 1.0
    assert explained_variance(torch.full((4,), 2.5), returns).item() == pytest.approx(0.0)
    rollout = Rollout(2, 3, (4,), 2, discrete=True, device=torch.device("cpu"))
    for t in range(2):
        rollout.put(t, torch.full((3, 4), float(t)), torch.tensor([0, 1, 0]),
                    torch.zeros(3), torch.arange(3.0))
    rollout.finish(torch.ones(2, 3), torch.zeros(2, 3), torch.zeros(3), 0.99, 0.95)
    mb = rollout.minibatch(torch.tensor([4, 0]))      # t=1 env 1, t=0 env 0
    assert mb["obs"][:, 0].tolist() == [1.0, 0.0] and mb["actions"].tolist() == [1, 0]
    assert mb["values"].tolist() == [1.0, 0.0] and len(rollout) == 6
